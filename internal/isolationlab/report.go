package isolationlab

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Formats are the table formats [WriteTable] knows.
var Formats = []string{"text", "markdown", "json", "csv"}

// column is one column of the table: its header and how a measurement fills it.
type column struct {
	header, csv string
	cell        func(m Measurement) string
}

func columns(campaignIDs []string) []column {
	cols := []column{
		{"strategy", "strategy", func(m Measurement) string { return m.Strategy }},
		{"workers", "workers", func(m Measurement) string { return strconv.Itoa(m.Workers) }},
		{"run", "run", func(m Measurement) string { return strconv.Itoa(m.Run) }},
		{"coupons", "coupons", func(m Measurement) string { return strconv.FormatInt(m.Coupons, 10) }},
	}
	for i, id := range campaignIDs {
		cols = append(cols, column{"R1 over " + id + " (yen)", "r1_overshoot_yen_" + id, func(m Measurement) string {
			if i >= len(m.Campaigns) {
				return ""
			}
			return strconv.FormatInt(m.Campaigns[i].OvershootYen, 10)
		}})
	}
	return append(cols,
		column{"R1 drift (yen)", "r1_counter_drift_yen", func(m Measurement) string { return strconv.FormatInt(m.CounterDriftYen, 10) }},
		column{"R2 dup pairs", "r2_duplicate_pairs", func(m Measurement) string { return strconv.FormatInt(m.DuplicatePairs, 10) }},
		column{"R3 over cap", "r3_members_over_cap", func(m Measurement) string { return strconv.FormatInt(m.MembersOverCap, 10) }},
		column{"pushes w/o coupon", "pushes_without_coupon", func(m Measurement) string { return strconv.FormatInt(m.PushesWithoutCoupon, 10) }},
		column{"retried %", "retried_pct", func(m Measurement) string { return strconv.FormatFloat(m.RetriedPct(), 'f', 1, 64) }},
		column{"RETRY_EXHAUSTED", "retry_exhausted", func(m Measurement) string { return strconv.Itoa(m.Exhausted) }},
		column{"errors", "errors", func(m Measurement) string { return strconv.Itoa(m.Errors) }},
		column{"req/s", "throughput_rps", func(m Measurement) string { return strconv.FormatFloat(m.Throughput, 'f', 0, 64) }},
		column{"p50 ms", "p50_ms", func(m Measurement) string { return strconv.FormatFloat(m.P50Ms, 'f', 1, 64) }},
		column{"p99 ms", "p99_ms", func(m Measurement) string { return strconv.FormatFloat(m.P99Ms, 'f', 1, 64) }},
	)
}

// WriteTable writes ms to w in format: "text" (aligned columns for a terminal), "markdown"
// (a GitHub table), "csv" (a header row, then one row per run) or "json" (an array of
// [Measurement]). RETRY_EXHAUSTED counts the Before code's SYSTEM_ERROR too; retried % is the
// transactions started beyond each request's first, per 100 requests.
func WriteTable(w io.Writer, format string, ms []Measurement) error {
	cols := columns(CampaignIDs(ms))
	rows := make([][]string, 0, len(ms)+1)
	header := make([]string, len(cols))
	for i, c := range cols {
		header[i] = c.header
	}
	rows = append(rows, header)
	for _, m := range ms {
		row := make([]string, len(cols))
		for i, c := range cols {
			row[i] = c.cell(m)
		}
		rows = append(rows, row)
	}
	csvHeader := make([]string, len(cols))
	for i, c := range cols {
		csvHeader[i] = c.csv
	}
	return writeRows(w, format, rows, csvHeader, ms)
}

// writeRows writes a table, rows[0] being its header, in format: aligned text, a GitHub markdown
// table, CSV with csvHeader as its header row, or jsonValue as indented JSON.
func writeRows(w io.Writer, format string, rows [][]string, csvHeader []string, jsonValue any) error {
	switch format {
	case "text":
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, r := range rows {
			fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
		}
		return tw.Flush()
	case "markdown":
		for i, r := range rows {
			if _, err := fmt.Fprintf(w, "| %s |\n", strings.Join(r, " | ")); err != nil {
				return err
			}
			if i == 0 {
				sep := make([]string, len(r))
				for j := range sep {
					sep[j] = "---:"
				}
				sep[0] = "---"
				fmt.Fprintf(w, "|%s|\n", strings.Join(sep, "|"))
			}
		}
		return nil
	case "csv":
		cw := csv.NewWriter(w)
		if err := cw.WriteAll(append([][]string{csvHeader}, rows[1:]...)); err != nil {
			return err
		}
		return cw.Error()
	case "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(jsonValue)
	}
	return fmt.Errorf("isolationlab: format %q: want one of %s", format, strings.Join(Formats, ", "))
}

// RetriedNote explains the "retried %" column, which can pass 100.
const RetriedNote = `"retried %" counts the transactions started beyond each request's first, per 100 requests:
over 100 means that requests were retried more than once on average (SQLSTATE 40001 under
REPEATABLE READ and SERIALIZABLE, or the Before code's blind retries).`

// WriteVerdict writes one line per strategy in ms, in order: which rules any of its runs broke,
// counted from the rule columns (R1 overshoot or counter drift, R2 duplicate pairs, R3 members
// over the cap, pushes for coupons that do not exist), and how many requests it gave up on;
// then [RetriedNote].
func WriteVerdict(w io.Writer, ms []Measurement) error {
	type tally struct {
		broke     []string
		exhausted int
		requests  int
	}
	var order []string
	by := map[string]*tally{}
	for _, m := range ms {
		t := by[m.Strategy]
		if t == nil {
			t = &tally{}
			by[m.Strategy] = t
			order = append(order, m.Strategy)
		}
		t.exhausted += m.Exhausted
		t.requests += m.Requests
		for _, r := range []struct {
			name   string
			broken bool
		}{
			{"R1 budget", m.OvershootYen() > 0},
			{"R1 counter", m.CounterDriftYen > 0},
			{"R2 one per member", m.DuplicatePairs > 0},
			{"R3 monthly cap", m.MembersOverCap > 0},
			{"pushes without a coupon", m.PushesWithoutCoupon > 0},
		} {
			if r.broken && !slices.Contains(t.broke, r.name) {
				t.broke = append(t.broke, r.name)
			}
		}
	}
	fmt.Fprintln(w, "\nVerdict (any run; rules counted with SQL on the tables):")
	for _, name := range order {
		t := by[name]
		line := "held every rule"
		if len(t.broke) > 0 {
			line = "BROKE " + strings.Join(t.broke, ", ")
		}
		if t.exhausted > 0 {
			line += fmt.Sprintf("; gave up on %d of %d requests (RETRY_EXHAUSTED)", t.exhausted, t.requests)
		}
		fmt.Fprintf(w, "  %-16s %s\n", name, line)
	}
	_, err := fmt.Fprintln(w, "\n"+RetriedNote)
	return err
}
