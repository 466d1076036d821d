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

// column is one column of a table of measurements M: its header, its CSV name, and how a
// measurement fills it.
type column[M any] struct {
	header, csv string
	cell        func(m M) string
}

// writeColumns writes ms in format, one row per measurement, through cols (see [writeRows]).
func writeColumns[M any](w io.Writer, format string, cols []column[M], ms []M) error {
	header, csvHeader := make([]string, len(cols)), make([]string, len(cols))
	for i, c := range cols {
		header[i], csvHeader[i] = c.header, c.csv
	}
	rows := [][]string{header}
	for _, m := range ms {
		row := make([]string, len(cols))
		for i, c := range cols {
			row[i] = c.cell(m)
		}
		rows = append(rows, row)
	}
	return writeRows(w, format, rows, csvHeader, ms)
}

func columns(campaignIDs []string) []column[Measurement] {
	cols := []column[Measurement]{
		{"strategy", "strategy", func(m Measurement) string { return m.Strategy }},
		{"workers", "workers", func(m Measurement) string { return strconv.Itoa(m.Workers) }},
		{"run", "run", func(m Measurement) string { return strconv.Itoa(m.Run) }},
		{"coupons", "coupons", func(m Measurement) string { return strconv.FormatInt(m.Coupons, 10) }},
	}
	for i, id := range campaignIDs {
		cols = append(cols, column[Measurement]{"R1 over " + id + " (yen)", "r1_overshoot_yen_" + id, func(m Measurement) string {
			if i >= len(m.Campaigns) {
				return ""
			}
			return strconv.FormatInt(m.Campaigns[i].OvershootYen, 10)
		}})
	}
	return append(cols,
		column[Measurement]{"R1 drift (yen)", "r1_counter_drift_yen", func(m Measurement) string { return strconv.FormatInt(m.CounterDriftYen, 10) }},
		column[Measurement]{"R2 dup pairs", "r2_duplicate_pairs", func(m Measurement) string { return strconv.FormatInt(m.DuplicatePairs, 10) }},
		column[Measurement]{"R3 over cap", "r3_members_over_cap", func(m Measurement) string { return strconv.FormatInt(m.MembersOverCap, 10) }},
		column[Measurement]{"pushes w/o coupon", "pushes_without_coupon", func(m Measurement) string { return strconv.FormatInt(m.PushesWithoutCoupon, 10) }},
		column[Measurement]{"retried %", "retried_pct", func(m Measurement) string { return strconv.FormatFloat(m.RetriedPct(), 'f', 1, 64) }},
		column[Measurement]{"RETRY_EXHAUSTED", "retry_exhausted", func(m Measurement) string { return strconv.Itoa(m.Exhausted) }},
		column[Measurement]{"errors", "errors", func(m Measurement) string { return strconv.Itoa(m.Errors) }},
		column[Measurement]{"req/s", "throughput_rps", func(m Measurement) string { return strconv.FormatFloat(m.Throughput, 'f', 0, 64) }},
		column[Measurement]{"p50 ms", "p50_ms", func(m Measurement) string { return strconv.FormatFloat(m.P50Ms, 'f', 1, 64) }},
		column[Measurement]{"p99 ms", "p99_ms", func(m Measurement) string { return strconv.FormatFloat(m.P99Ms, 'f', 1, 64) }},
	)
}

// WriteTable writes ms to w in format: "text" (aligned columns, one line per run: about 220
// columns with three campaigns; [WriteTerminalTable] wraps the same columns for a terminal),
// "markdown"
// (a GitHub table), "csv" (a header row, then one row per run) or "json" (an array of
// [Measurement]). RETRY_EXHAUSTED counts the Before code's SYSTEM_ERROR too; retried % is the
// transactions started beyond each request's first, per 100 requests.
func WriteTable(w io.Writer, format string, ms []Measurement) error {
	return writeColumns(w, format, columns(CampaignIDs(ms)), ms)
}

// terminalColumn is one column of [WriteTerminalTable]: a header of two short lines, explained
// in the key under its table.
type terminalColumn struct {
	top, bottom string
	cell        func(m Measurement) string
}

// WriteTerminalTable writes ms for a terminal, in about 100 columns with three campaigns: the
// table of [WriteTable] wrapped into two tables, the rules broken (counted with SQL after each
// run) and the retries, give-ups and latency, each with the strategy, workers and run, headers
// of two short lines, and a key under each table for what a short header means.
func WriteTerminalTable(w io.Writer, ms []Measurement) error {
	first := []terminalColumn{
		{"", "strategy", nil}, // filled left-aligned by writeTerminal
		{"", "workers", func(m Measurement) string { return strconv.Itoa(m.Workers) }},
		{"", "run", func(m Measurement) string { return strconv.Itoa(m.Run) }},
	}
	rules := append(slices.Clone(first), terminalColumn{"", "coupons", func(m Measurement) string { return strconv.FormatInt(m.Coupons, 10) }})
	for i, id := range CampaignIDs(ms) {
		rules = append(rules, terminalColumn{"R1 over", id, func(m Measurement) string {
			if i >= len(m.Campaigns) {
				return ""
			}
			return strconv.FormatInt(m.Campaigns[i].OvershootYen, 10)
		}})
	}
	rules = append(rules,
		terminalColumn{"R1", "drift", func(m Measurement) string { return strconv.FormatInt(m.CounterDriftYen, 10) }},
		terminalColumn{"R2", "dups", func(m Measurement) string { return strconv.FormatInt(m.DuplicatePairs, 10) }},
		terminalColumn{"R3", "over", func(m Measurement) string { return strconv.FormatInt(m.MembersOverCap, 10) }},
		terminalColumn{"pushes", "w/o coupon", func(m Measurement) string { return strconv.FormatInt(m.PushesWithoutCoupon, 10) }},
	)
	perf := append(slices.Clone(first),
		terminalColumn{"retried", "%", func(m Measurement) string { return strconv.FormatFloat(m.RetriedPct(), 'f', 1, 64) }},
		terminalColumn{"RETRY_", "EXHAUSTED", func(m Measurement) string { return strconv.Itoa(m.Exhausted) }},
		terminalColumn{"", "errors", func(m Measurement) string { return strconv.Itoa(m.Errors) }},
		terminalColumn{"", "req/s", func(m Measurement) string { return strconv.FormatFloat(m.Throughput, 'f', 0, 64) }},
		terminalColumn{"p50", "ms", func(m Measurement) string { return strconv.FormatFloat(m.P50Ms, 'f', 1, 64) }},
		terminalColumn{"p99", "ms", func(m Measurement) string { return strconv.FormatFloat(m.P99Ms, 'f', 1, 64) }},
	)
	fmt.Fprintln(w, "Rules, counted with SQL on the tables after each run (0 = the rule held):")
	if err := writeTerminal(w, rules, ms); err != nil {
		return err
	}
	fmt.Fprint(w, `  R1 over: yen issued beyond the campaign's budget. R1 drift: yen between the budget counters
  and the coupons they count. R2 dups: (campaign, member) pairs holding more than one coupon.
  R3 over: member-months over the monthly cap. pushes w/o coupon: LINE pushes (or outbox rows)
  for coupons that do not exist.

Retries, give-ups and latency:
`)
	if err := writeTerminal(w, perf, ms); err != nil {
		return err
	}
	_, err := fmt.Fprint(w, `  retried %: transactions started beyond each request's first, per 100 requests (see below).
  RETRY_EXHAUSTED: requests given up on (the Before code's SYSTEM_ERROR too). errors: requests
  that got no result. req/s: throughput; p50, p99: request latency in milliseconds.
`)
	return err
}

// writeTerminal writes one table of [WriteTerminalTable]: the two header lines, then a line per
// measurement, columns right-aligned except the first (the strategy), two spaces apart.
func writeTerminal(w io.Writer, cols []terminalColumn, ms []Measurement) error {
	width := len("strategy")
	for _, m := range ms {
		width = max(width, len(m.Strategy))
	}
	left := func(s string) string { return s + strings.Repeat(" ", width-len(s)) }
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(first string, cell func(c terminalColumn) string) {
		cells := []string{left(first)}
		for _, c := range cols[1:] {
			cells = append(cells, cell(c))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	row("", func(c terminalColumn) string { return c.top })
	row("strategy", func(c terminalColumn) string { return c.bottom })
	for _, m := range ms {
		row(m.Strategy, func(c terminalColumn) string { return c.cell(m) })
	}
	return tw.Flush()
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
