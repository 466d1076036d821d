package isolationlab

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// series is one bar of each group in the chart: a label and the figure it shows of a measurement.
type series struct {
	label string
	value func(m Measurement) float64
}

var (
	violationSeries = []series{
		{"R1 overshoot (1,000 yen)", func(m Measurement) float64 { return float64(m.OvershootYen()) / 1000 }},
		{"R1 counter drift (1,000 yen)", func(m Measurement) float64 { return float64(m.CounterDriftYen) / 1000 }},
		{"R2 duplicate pairs", func(m Measurement) float64 { return float64(m.DuplicatePairs) }},
		{"R3 members over the cap", func(m Measurement) float64 { return float64(m.MembersOverCap) }},
		{"pushes for coupons that do not exist", func(m Measurement) float64 { return float64(m.PushesWithoutCoupon) }},
	}
	retrySeries = []series{
		{"transactions retried (% of requests)", func(m Measurement) float64 { return m.RetriedPct() }},
		{"RETRY_EXHAUSTED / SYSTEM_ERROR (% of requests)", func(m Measurement) float64 {
			return 100 * float64(m.Exhausted) / float64(max(m.Requests, 1))
		}},
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

// WriteChart draws ms as a PNG of width x height points: above, the rule violations per strategy
// and worker count; below, the retries and give-ups in percent of requests. Each bar is the mean
// over the runs. Drawn with gonum.org/v1/plot.
func WriteChart(w io.Writer, ms []Measurement, width, height vg.Length) error {
	gs := groups(ms)
	if len(gs) == 0 {
		return fmt.Errorf("isolationlab: chart: no measurements")
	}
	top, err := barPlot(gs, violationSeries, "Rules broken: SQL counts after each run (mean of runs)", "count")
	if err != nil {
		return err
	}
	bottom, err := barPlot(gs, retrySeries, "Retries and give-ups (mean of runs)", "% of requests")
	if err != nil {
		return err
	}
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadX: vg.Millimeter, PadY: 6 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}
	plots := [][]*plot.Plot{{top}, {bottom}}
	canvases := plot.Align(plots, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

func barPlot(gs []group, ss []series, title, yLabel string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.Y.Label.Text = yLabel
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = false
	p.Legend.TextStyle.Font.Size = vg.Points(9)
	p.X.Tick.Label.Font.Size = vg.Points(9)
	barWidth := vg.Points(float64(min(14, 60/len(ss))))
	p.Add(plotter.NewGrid())
	names := make([]string, len(gs))
	for i, g := range gs {
		names[i] = g.name
	}
	top := 0.0
	for si, s := range ss {
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
		bars.Offset = barWidth * vg.Length(float64(si)-float64(len(ss)-1)/2)
		labels, err := valueLabels(vals, bars.Offset)
		if err != nil {
			return nil, err
		}
		p.Add(bars, labels)
		p.Legend.Add(s.label, bars)
	}
	// Room above the highest bar for its label and for the legend.
	p.Y.Max = max(1, top) * 1.45
	p.NominalX(names...)
	return p, nil
}

// valueLabels writes each non-zero bar's value above it, turned upright so that neighbours do
// not overlap; a bar that is not there reads as the rule having held.
func valueLabels(vals plotter.Values, offset vg.Length) (*plotter.Labels, error) {
	xyl := plotter.XYLabels{XYs: make(plotter.XYs, len(vals)), Labels: make([]string, len(vals))}
	for i, v := range vals {
		xyl.XYs[i] = plotter.XY{X: float64(i), Y: v}
		if v > 0 {
			xyl.Labels[i] = strconv.FormatFloat(v, 'f', -1, 64)
			if v != math.Trunc(v) {
				xyl.Labels[i] = strconv.FormatFloat(v, 'f', 1, 64)
			}
		}
	}
	l, err := plotter.NewLabels(xyl)
	if err != nil {
		return nil, fmt.Errorf("isolationlab: chart labels: %w", err)
	}
	for i := range l.TextStyle {
		l.TextStyle[i].Font.Size = vg.Points(7)
		l.TextStyle[i].Rotation = math.Pi / 2
		l.TextStyle[i].XAlign = draw.XLeft
		l.TextStyle[i].YAlign = draw.YCenter
	}
	l.Offset = vg.Point{X: offset, Y: vg.Points(2)}
	return l, nil
}
