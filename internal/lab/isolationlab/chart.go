package isolationlab

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // registers png, jpg, jpeg, tif, tiff with draw.NewFormattedCanvas
	_ "gonum.org/v1/plot/vg/vgpdf" // registers pdf
	_ "gonum.org/v1/plot/vg/vgsvg" // registers svg
)

// ChartFormats are the file formats [WriteChart] writes, named by a chart file's extension.
var ChartFormats = []string{"png", "svg", "pdf", "jpg", "jpeg", "tif", "tiff"}

// ChartFormat returns the format a chart file's extension names (".png" -> "png"), or an error
// that lists the formats for another extension.
func ChartFormat(path string) (string, error) {
	ext := strings.ToLower(strings.TrimPrefix(filepath.Ext(path), "."))
	if !slices.Contains(ChartFormats, ext) {
		return "", fmt.Errorf("chart %s: the extension names the format; want one of .%s", path, strings.Join(ChartFormats, ", ."))
	}
	return ext, nil
}

// series is one bar of each group in the chart: a label and the figure it shows of a measurement.
type series struct {
	label string
	value func(m Measurement) float64
}

// panel is one plot of the chart: its series share one unit, named on the y axis.
type panel struct {
	title, unit string
	series      []series
	ticks       plot.Ticker
}

var (
	panels = []panel{
		{"R1 budget: yen beyond the budgets, and counter drift (SQL after each run; 0 = the rule held)", "yen", []series{
			{"R1 overshoot", func(m Measurement) float64 { return float64(m.OvershootYen()) }},
			{"R1 counter drift", func(m Measurement) float64 { return float64(m.CounterDriftYen) }},
		}, yenTicks{}},
		{"R2, R3 and pushes: rows that break a rule (SQL after each run; 0 = the rule held)", "count", []series{
			{"R2 duplicate (campaign, member) pairs", func(m Measurement) float64 { return float64(m.DuplicatePairs) }},
			{"R3 member-months over the cap", func(m Measurement) float64 { return float64(m.MembersOverCap) }},
			{"pushes for coupons that do not exist", func(m Measurement) float64 { return float64(m.PushesWithoutCoupon) }},
		}, plot.DefaultTicks{}},
		{"Retries and give-ups (over 100% = more than one retry per request)", "% of requests", []series{
			{"transactions retried", func(m Measurement) float64 { return m.RetriedPct() }},
			{"RETRY_EXHAUSTED / SYSTEM_ERROR", func(m Measurement) float64 {
				return 100 * float64(m.Exhausted) / float64(max(m.Requests, 1))
			}},
		}, plot.DefaultTicks{}},
	}
	// palette is the Okabe-Ito colour-blind safe palette.
	palette = []color.Color{
		color.RGBA{0xE6, 0x9F, 0x00, 0xFF}, color.RGBA{0x56, 0xB4, 0xE9, 0xFF}, color.RGBA{0x00, 0x9E, 0x73, 0xFF},
		color.RGBA{0xD5, 0x5E, 0x00, 0xFF}, color.RGBA{0xCC, 0x79, 0xA7, 0xFF}, color.RGBA{0x00, 0x72, 0xB2, 0xFF},
	}
)

// group is the runs of one strategy at one worker count.
type group struct {
	name string
	runs []Measurement
}

func groups(ms []Measurement) []group {
	var gs []group
	for _, m := range ms {
		name := fmt.Sprintf("%s\n%d workers", m.Strategy, m.Workers)
		i := slices.IndexFunc(gs, func(g group) bool { return g.name == name })
		if i < 0 {
			gs = append(gs, group{name: name})
			i = len(gs) - 1
		}
		gs[i].runs = append(gs[i].runs, m)
	}
	return gs
}

// WriteChart draws ms in format (one of [ChartFormats]) at width x height: one panel per unit,
// yen (R1), rows (R2, R3, pushes without a coupon) and percent of requests (retries and
// give-ups), each with one bar group per strategy and worker count. Each bar is the mean over
// the runs, as each panel's title says (with how many runs), and carries its value; a zero is drawn as a labelled "0" on the axis, so that a rule
// that held reads as a measurement, not as missing data. Drawn with gonum.org/v1/plot.
func WriteChart(w io.Writer, ms []Measurement, width, height vg.Length, format string) error {
	gs := groups(ms)
	if len(gs) == 0 {
		return fmt.Errorf("isolationlab: chart: no measurements")
	}
	if !slices.Contains(ChartFormats, format) {
		return fmt.Errorf("isolationlab: chart format %q: want one of %s", format, strings.Join(ChartFormats, ", "))
	}
	plots := make([][]*plot.Plot, len(panels))
	means := meansNote(gs)
	for i, pn := range panels {
		pn.title += "\n" + means
		p, err := barPlot(gs, pn)
		if err != nil {
			return err
		}
		plots[i] = []*plot.Plot{p}
	}
	c, err := draw.NewFormattedCanvas(width, height, format)
	if err != nil {
		return fmt.Errorf("isolationlab: chart: %w", err)
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadX: vg.Millimeter, PadY: 6 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	canvases := plot.Align(plots, tiles, draw.New(c))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err = c.WriteTo(w)
	return err
}

// meansNote says what a bar is: the mean of the runs of one strategy at one worker count (or the
// one run), with how many runs, so that a bar is not read as one run's figure.
func meansNote(gs []group) string {
	lo, hi := len(gs[0].runs), len(gs[0].runs)
	for _, g := range gs {
		lo, hi = min(lo, len(g.runs)), max(hi, len(g.runs))
	}
	switch {
	case hi == 1:
		return "each bar: one run of a strategy at a worker count"
	case lo == hi:
		return fmt.Sprintf("each bar: the mean of %d runs of a strategy at a worker count (value above it)", lo)
	}
	return fmt.Sprintf("each bar: the mean of the %d to %d runs of a strategy at a worker count (value above it)", lo, hi)
}

func barPlot(gs []group, pn panel) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.title
	p.Title.TextStyle.Font.Size = vg.Points(11)
	p.Y.Label.Text = pn.unit
	p.Y.Label.TextStyle.Font.Size = vg.Points(10)
	p.Y.Tick.Marker = pn.ticks
	p.Y.Tick.Label.Font.Size = vg.Points(9)
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.X.Tick.Label.Font.Size = vg.Points(10)
	barWidth := vg.Points(float64(min(16, 72/len(pn.series))))
	p.Add(plotter.NewGrid())
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = g.name
	}
	top := 0.0
	for si, s := range pn.series {
		vals := make(plotter.Values, len(gs))
		for gi, g := range gs {
			sum := 0.0
			for _, m := range g.runs {
				sum += s.value(m)
			}
			vals[gi] = sum / float64(len(g.runs))
			top = max(top, vals[gi])
		}
		bars, err := plotter.NewBarChart(vals, barWidth)
		if err != nil {
			return nil, fmt.Errorf("isolationlab: chart: %w", err)
		}
		bars.LineStyle.Width = 0
		bars.Color = palette[si%len(palette)]
		bars.Offset = barWidth * vg.Length(float64(si)-float64(len(pn.series)-1)/2)
		labels, err := valueLabels(vals, bars.Offset, pn.unit == "yen", bars.Color)
		if err != nil {
			return nil, err
		}
		p.Add(bars, labels)
		p.Legend.Add(s.label, bars)
	}
	// Room above the highest bar for its label and for the legend.
	p.Y.Max = max(1, top) * 1.6
	p.NominalX(names...)
	// Half a group of room on each side, so that the outer groups' bars are whole.
	p.X.Min, p.X.Max = -0.5, float64(len(gs))-0.5
	return p, nil
}

// valueLabels writes each bar's value above it in the bar's colour c, turned upright so that
// neighbours do not overlap; a zero gets its "0" too, on the axis, so a rule that held is
// visibly measured.
func valueLabels(vals plotter.Values, offset vg.Length, yen bool, c color.Color) (*plotter.Labels, error) {
	xyl := plotter.XYLabels{XYs: make(plotter.XYs, len(vals)), Labels: make([]string, len(vals))}
	for i, v := range vals {
		xyl.XYs[i] = plotter.XY{X: float64(i), Y: v}
		xyl.Labels[i] = formatValue(v, yen)
	}
	l, err := plotter.NewLabels(xyl)
	if err != nil {
		return nil, fmt.Errorf("isolationlab: chart labels: %w", err)
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(9)
		l.TextStyle[i].Color = c
		l.TextStyle[i].Rotation = math.Pi / 2
		l.TextStyle[i].XAlign = draw.XLeft
		l.TextStyle[i].YAlign = draw.YCenter
	}
	l.Offset = vg.Point{X: offset, Y: vg.Points(2)}
	return l, nil
}

// formatValue is a bar's label: yen rounded to the yen with thousands separators, other whole
// numbers as they are, others with one decimal (one significant digit below 0.1).
func formatValue(v float64, yen bool) string {
	switch {
	case yen:
		return thousands(int64(math.Round(v)))
	case v != 0 && math.Abs(v) < 0.1:
		return strconv.FormatFloat(v, 'g', 1, 64) // 0.02, not a "0.0" that reads as none
	case v != math.Trunc(v):
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'f', 0, 64)
}

// thousands formats n with thousands separators: 1234567 -> "1,234,567".
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// yenTicks are the default ticks labelled in yen with thousands separators.
type yenTicks struct{}

func (yenTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i, t := range ticks {
		if t.Label != "" {
			ticks[i].Label = thousands(int64(t.Value))
		}
	}
	return ticks
}
