package isolationlab_test

import (
	"bytes"
	"strings"
	"testing"

	"gonum.org/v1/plot/vg"

	"github.com/mops/coupon-api/internal/lab/isolationlab"
)

// chartMeasurements: a strategy that broke rules and one that held them all (its bars are 0).
var chartMeasurements = []isolationlab.Measurement{
	{Strategy: "before", Workers: 8, Run: 1, Requests: 1800, Coupons: 1500, CounterDriftYen: 900_000,
		Campaigns: []isolationlab.CampaignFigures{{CampaignID: "SW-A", BudgetYen: 100_000, CounterYen: 100_000,
			ActualYen: 400_000, OvershootYen: 300_000}},
		DuplicatePairs: 300, MembersOverCap: 12, Exhausted: 2},
	{Strategy: "repeatable-read", Workers: 32, Run: 1, Requests: 1800, Coupons: 400, Retries: 2160,
		PushesWithoutCoupon: 900, Exhausted: 700},
	{Strategy: "good", Workers: 8, Run: 1, Requests: 1800, Coupons: 600, Retries: 18},
}

// TestChartFormats: the chart is written in the format its file's extension names, and an
// extension without a format is refused.
func TestChartFormats(t *testing.T) {
	t.Parallel()
	magic := map[string]string{"png": "\x89PNG", "svg": "<?xml", "pdf": "%PDF", "jpg": "\xff\xd8\xff",
		"jpeg": "\xff\xd8\xff", "tif": "II*\x00", "tiff": "II*\x00"}
	for _, format := range isolationlab.ChartFormats {
		got, err := isolationlab.ChartFormat("lab." + strings.ToUpper(format))
		if err != nil || got != format {
			t.Errorf("ChartFormat(lab.%s): %q, %v", strings.ToUpper(format), got, err)
		}
		var buf bytes.Buffer
		if err := isolationlab.WriteChart(&buf, chartMeasurements, 20*vg.Centimeter, 20*vg.Centimeter, format); err != nil {
			t.Fatalf("%s: %v", format, err)
		}
		if want, ok := magic[format]; !ok || !bytes.HasPrefix(buf.Bytes(), []byte(want)) {
			t.Errorf("%s chart starts %q, want %q", format, buf.Bytes()[:min(8, buf.Len())], want)
		}
	}
	for _, path := range []string{"lab.gif", "lab", "docs/lab.png.txt"} {
		if _, err := isolationlab.ChartFormat(path); err == nil {
			t.Errorf("ChartFormat(%s): no error", path)
		}
	}
}

// TestChartLabelsZeros: a rule that held is drawn as a labelled 0, one unit per panel (yen apart
// from counts), and yen with thousands separators.
func TestChartLabelsZeros(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := isolationlab.WriteChart(&buf, chartMeasurements, 30*vg.Centimeter, 32*vg.Centimeter, "svg"); err != nil {
		t.Fatal(err)
	}
	svg := buf.String()
	texts := strings.Count(svg, ">0</text>")
	// good holds all 7 figures but retries; repeatable-read holds R1 (2), R2, RETRY: 4 zeros +
	// before's pushes: at least 2 + 3 + 1 + 1 zeros are drawn.
	if texts < 7 {
		t.Errorf("%d zero labels drawn, want one for each bar that is 0", texts)
	}
	for _, want := range []string{">yen<", ">count<", ">% of requests<", ">300,000<", ">900,000<"} {
		if !strings.Contains(svg, want) {
			t.Errorf("the chart has no %q", want)
		}
	}
}

// TestVerdict: one line per strategy naming the rules it broke, and the note on retried %.
func TestVerdict(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	if err := isolationlab.WriteVerdict(&buf, chartMeasurements); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"before           BROKE R1 budget, R1 counter, R2 one per member, R3 monthly cap; gave up on 2 of 1800",
		"repeatable-read  BROKE pushes without a coupon; gave up on 700 of 1800 requests",
		"good             held every rule\n",
		"over 100 means",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("verdict lacks %q:\n%s", want, out)
		}
	}
}
