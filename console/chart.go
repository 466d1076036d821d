package console

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// The chart's drawing area, in SVG user units.
const (
	chartW, chartH = 720, 280
	padL, padR     = 90, 70
	padT, padB     = 20, 40
)

// chart is what the burn-down draws: the points (issued yen of live coupons and the budget over
// time, as burndown.json answers them) across the campaign's period, the releases as the steps
// of the coupons they have opened, and the forecast as a projection to the instant the coupons
// run out.
type chart struct {
	points      []Point
	from, to    time.Time // the x axis
	discountYen int64
	releases    []campaign.ReleaseStatus
	// projection is the forecast's end: the instant and the yen issued then; nil without one.
	projection *Point
}

// newChart is campaign s's chart of points, with its forecast at perMinute coupons a minute.
// The x axis spans the campaign's period: from its start (or its first point) to its end, or,
// when it has none, to the latest of now, its last release and the forecast.
func newChart(s campaign.Status, points []Point, perMinute float64) chart {
	c := chart{points: points, discountYen: int64(max(s.DiscountYen, 1)), releases: s.Schedule, to: s.At,
		projection: projection(s, perMinute)}
	c.from = s.At
	if s.StartsAt != nil {
		c.from = *s.StartsAt
	}
	if len(points) > 0 && points[0].T.Before(c.from) {
		c.from = points[0].T
	}
	switch {
	case s.EndsAt != nil:
		c.to = *s.EndsAt
	default:
		if n := len(s.Schedule); n > 0 && s.Schedule[n-1].At.After(c.to) {
			c.to = s.Schedule[n-1].At
		}
		if c.projection != nil && c.projection.T.After(c.to) {
			c.to = c.projection.T
		}
	}
	if !c.to.After(c.from) {
		c.from = c.to.Add(-time.Hour)
	}
	return c
}

// projection is the forecast's end for campaign s at perMinute coupons a minute: the instant
// its coupons run out with the yen issued then, or, when its end comes first, its end with the
// yen the pace issues by then; nil without a forecast.
func projection(s campaign.Status, perMinute float64) *Point {
	_, at := forecast(s, perMinute)
	switch {
	case at.IsZero():
		return nil
	case s.EndsAt != nil && at.After(*s.EndsAt):
		return &Point{T: *s.EndsAt, IssuedYen: int64(s.IssuedYen) + int64(perMinute*s.EndsAt.Sub(s.At).Minutes())*int64(s.DiscountYen)}
	}
	return &Point{T: at, IssuedYen: int64(s.IssuedYen + s.RemainingCoupons*s.DiscountYen)}
}

// svg draws the chart on the server, so that the page needs no script: gridlines with their
// amounts in 円 (left) and 枚 (right), the budget as a stepped line, the releases' opened coupons
// as steps, the issued yen as a line with one circle (class "pt", data-issued-yen) per point, and
// the projection as a dashed line; a message instead when nothing has been issued.
func (c chart) svg() template.HTML {
	if len(c.points) == 0 || c.points[len(c.points)-1].IssuedYen == 0 {
		return `<p class="empty" data-chart-empty>まだ配布がありません。配布が始まると、ここに発行額の推移を描きます。</p>`
	}
	top := int64(1)
	for _, p := range c.points {
		top = max(top, p.BudgetYen, p.IssuedYen)
	}
	stepCoupons := niceStep(top/c.discountYen, 4)
	top = ((top/c.discountYen + stepCoupons - 1) / stepCoupons) * stepCoupons * c.discountYen
	x := func(t time.Time) float64 {
		return padL + float64(t.Sub(c.from))/float64(c.to.Sub(c.from))*float64(chartW-padL-padR)
	}
	y := func(v int64) float64 { return padT + (1-float64(v)/float64(top))*float64(chartH-padT-padB) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="burndown" role="img" aria-label="発行額と予算の推移（下の表に同じデータ）" viewBox="0 0 %d %d" xmlns="http://www.w3.org/2000/svg">`, chartW, chartH)
	for coupons := int64(0); coupons*c.discountYen <= top; coupons += stepCoupons {
		v := coupons * c.discountYen
		fmt.Fprintf(&b, `<line class="grid" x1="%d" y1="%.1f" x2="%d" y2="%.1f"/>`, padL, y(v), chartW-padR, y(v))
		fmt.Fprintf(&b, `<text class="label" x="%d" y="%.1f" text-anchor="end">%s</text>`, padL-6, y(v)+4, template.HTMLEscapeString(yen(v)))
		fmt.Fprintf(&b, `<text class="label" x="%d" y="%.1f">%s 枚</text>`, chartW-padR+6, y(v)+4, groupDigits(coupons))
	}
	fmt.Fprintf(&b, `<line class="axis" x1="%d" y1="%d" x2="%d" y2="%d"/>`, padL, chartH-padB, chartW-padR, chartH-padB)
	fmt.Fprintf(&b, `<text class="label" x="%d" y="%d">%s</text>`, padL, chartH-12, shortTime(c.from))
	fmt.Fprintf(&b, `<text class="label" x="%d" y="%d" text-anchor="end">%s</text>`, chartW-padR, chartH-12, shortTime(c.to))
	c.steps(&b, x, y)
	var issued strings.Builder
	for _, p := range c.points {
		fmt.Fprintf(&issued, " %.1f,%.1f", x(p.T), y(p.IssuedYen))
	}
	fmt.Fprintf(&b, `<polyline class="issued" points="%s"/>`, issued.String())
	if last := c.points[len(c.points)-1]; c.projection != nil {
		fmt.Fprintf(&b, `<line class="projection" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" data-projection-at="%d"/>`,
			x(last.T), y(last.IssuedYen), x(c.projection.T), y(c.projection.IssuedYen), c.projection.T.Unix())
	}
	for _, p := range c.points {
		fmt.Fprintf(&b, `<circle class="pt" cx="%.1f" cy="%.1f" r="2.5" data-issued-yen="%d"><title>%s %s</title></circle>`,
			x(p.T), y(p.IssuedYen), p.IssuedYen, tokyoTime(p.T), template.HTMLEscapeString(yen(p.IssuedYen)))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers and escaped text only
}

// steps draws the budget (stepped, as it changed) and the releases' opened coupons (a step at
// each release) onto b.
func (c chart) steps(b *strings.Builder, x func(time.Time) float64, y func(int64) float64) {
	var budget strings.Builder
	for i, p := range c.points {
		if i > 0 {
			fmt.Fprintf(&budget, " %.1f,%.1f", x(p.T), y(c.points[i-1].BudgetYen))
		}
		fmt.Fprintf(&budget, " %.1f,%.1f", x(p.T), y(p.BudgetYen))
	}
	fmt.Fprintf(&budget, " %.1f,%.1f", x(c.to), y(c.points[len(c.points)-1].BudgetYen))
	fmt.Fprintf(b, `<polyline class="budget" points="%s"/>`, budget.String())
	if len(c.releases) == 0 {
		return
	}
	var steps strings.Builder
	fmt.Fprintf(&steps, " %.1f,%.1f", x(c.from), y(0))
	for _, r := range c.releases {
		opened := int64(r.Released) * c.discountYen
		fmt.Fprintf(&steps, " %.1f,%.1f %.1f,%.1f", x(r.At), y(opened-int64(r.Coupons)*c.discountYen), x(r.At), y(opened))
	}
	fmt.Fprintf(&steps, " %.1f,%.1f", x(c.to), y(int64(c.releases[len(c.releases)-1].Released)*c.discountYen))
	fmt.Fprintf(b, `<polyline class="release" data-releases="%d" points="%s"/>`, len(c.releases), steps.String())
}

// niceStep is a step of 1, 2 or 5 times a power of ten that divides 0..top into about n parts.
func niceStep(top int64, n int) int64 {
	if top <= int64(n) {
		return 1
	}
	raw := float64(top) / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return int64(m * p)
		}
	}
	return int64(10 * p)
}
