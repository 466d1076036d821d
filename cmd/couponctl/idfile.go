package main

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/mops/coupon-api/shared/ids"
)

// The id files of grant, campaign audience add|remove and coupon void --file: one id a line, or
// (members only) one column of a CSV with a header (--csv-column). Every refusal names the file
// and the line, and the commands exit 2 before anything is sent.

// columnOf reads the headings of the CSV r (the file at path) and answers the index of the one
// named column (trimmed, as written); a file without it, or with two, is refused.
func columnOf(path string, r *csv.Reader, column string) (int, error) {
	head, err := r.Read()
	if err == io.EOF {
		return 0, fmt.Errorf("%s: empty: --csv-column wants a CSV whose first line holds the headings", path)
	} else if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	named := func(h string) bool { return strings.TrimSpace(h) == column }
	col := slices.IndexFunc(head, named)
	switch {
	case col < 0 && len(head) == 1 && strings.ContainsAny(head[0], ";\t"):
		return 0, fmt.Errorf("%s:1: its headings %q are separated by a semicolon or a tab: save it as CSV (commas)", path, head[0])
	case col < 0:
		return 0, fmt.Errorf("%s:1: no column %q; its headings are %q", path, column, head)
	case slices.IndexFunc(head[col+1:], named) >= 0:
		return 0, fmt.Errorf("%s:1: two columns are headed %q: rename one; its headings are %q", path, column, head)
	}
	return col, nil
}

// utf8BOM is the byte order mark some editors (Excel's "CSV UTF-8") put before a file's first line.
const utf8BOM = "\ufeff"

// readIDs reads one id a line from path and checks each with check; it names the first bad
// line. Blank lines are skipped, and so are comments: lines starting with "#" and a space or
// tab, which no id can be (ids hold no space), so that an id starting with "#" is read as one. A
// UTF-8 byte order mark before the first line is skipped with a note on w. A spreadsheet's row or
// heading is refused ([notAnID], [errNotAnID]).
func readIDs(path string, check func(string) error, w io.Writer) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ids []string
	first := 0 // the line of the first id
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line, err := idLine(path, n, sc.Text(), check, w)
		if err != nil {
			return nil, err
		}
		if line == "" {
			continue
		}
		if first == 0 {
			first = n
		}
		ids = append(ids, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case len(ids) == 0:
		return nil, fmt.Errorf("%s: no ids in it", path)
	case idHeading(ids):
		return nil, fmt.Errorf("%s:%d: %q has no digit, unlike the ids below it: a column heading: %w",
			path, first, ids[0], errNotAnID)
	}
	return ids, nil
}

// idLine is line n of the id file at path, text, as readIDs reads it: its id, trimmed and
// checked, or "" for a blank line or a comment; a UTF-8 byte order mark before line 1 is
// skipped with a note on w.
func idLine(path string, n int, text string, check func(string) error, w io.Writer) (string, error) {
	if n == 1 {
		var bom bool
		if text, bom = idTrimBOM(text); bom {
			fmt.Fprintf(w, "%s: skipped the UTF-8 byte order mark (BOM) before line 1\n", path)
		}
	}
	if why := idEncoding(text); why != "" {
		return "", fmt.Errorf("%s:%d: %s", path, n, why)
	}
	line := strings.TrimSpace(text)
	if line == "" || idComment(line) {
		return "", nil
	}
	if err := idRow(line); err != nil {
		return "", fmt.Errorf("%s:%d: %w", path, n, err)
	}
	if err := check(line); err != nil {
		return "", fmt.Errorf("%s:%d: %w", path, n, err)
	}
	return line, nil
}

// misencoded says what in line is not the UTF-8 (ASCII) text of an id file, "" when nothing is:
// UTF-16 text (its byte order mark, or the NUL bytes between its ASCII characters), or a UTF-8
// byte order mark past the file's start (files joined together, each saved with one).
func misencoded(line string) string {
	switch {
	case strings.Contains(line, "\xff\xfe"), strings.Contains(line, "\xfe\xff"), strings.Contains(line, "\x00"):
		return "UTF-16 text (a UTF-16 byte order mark or NUL bytes) from here on: save the file as UTF-8 (or ASCII)"
	case strings.Contains(line, utf8BOM):
		return fmt.Sprintf("a UTF-8 byte order mark (BOM) at byte %d of the line, where files were joined: remove it",
			strings.Index(line, utf8BOM))
	}
	return ""
}

// idEncoding is [misencoded] as readIDs calls it: a variable, so that a test can swap in its
// broken variant (newuser_test.go).
var idEncoding = misencoded

// isComment reports whether line (trimmed) is a comment of an id file: "#" alone is an id.
func isComment(line string) bool {
	return strings.HasPrefix(line, "# ") || strings.HasPrefix(line, "#\t")
}

// idComment is isComment, and idTrimBOM returns a line without a leading UTF-8 byte order mark
// and whether it had one, as readIDs calls them: variables, so that a test can swap in their
// broken variants (members_file_test.go).
var (
	idComment = isComment
	idTrimBOM = func(line string) (string, bool) { return strings.CutPrefix(line, utf8BOM) }
)

// errNotAnID is the refusal of a line of an id file that is a spreadsheet's row or heading: an
// id may hold a comma (IssueCoupon takes any visible ASCII), but a file read one id a line
// refuses one, so that a row such as "c006,gold" or a heading such as "member_id" is never
// issued a coupon as a member id.
var errNotAnID = errors.New("a spreadsheet's row or heading, not an id: a file of ids holds one id a line and nothing else")

// rowSeparators are the characters of a CSV, TSV or pipe-separated row that [notAnID] refuses
// in a line.
const rowSeparators = ",;\t\"|"

// headings are column headings (lower case) that [notAnID] refuses on any line; [headingFirst]
// finds the others.
var headings = []string{"id", "ids", "member", "members", "member_id", "memberid", "member id", "member_no",
	"coupon", "coupon_id", "couponid", "line_user_id", "customer", "customer_id", "user", "user_id", "userid", "email"}

// notAnID refuses line, a trimmed line of an id file that is not a comment, when it is a
// spreadsheet's row or heading: a row's separator, a spreadsheet's text marker (a leading
// apostrophe: '0012 keeps its zeros in Excel), or a known column heading. [errNotAnID], saying
// which.
func notAnID(line string) error {
	switch i := strings.IndexAny(line, rowSeparators); {
	case i >= 0:
		return fmt.Errorf("%q holds %q: %w", line, line[i:i+1], errNotAnID)
	case strings.HasPrefix(line, "'"):
		return fmt.Errorf("%q starts with a spreadsheet's text marker ('): %w", line, errNotAnID)
	case slices.Contains(headings, strings.ToLower(line)):
		return fmt.Errorf("%q is a column heading: %w", line, errNotAnID)
	}
	return nil
}

// headingFirst says the first of ids is a column heading by its shape: it has no digit while
// at least half of the ids after it have one (email above c006, c007: a heading the list of
// [headings] does not know).
func headingFirst(ids []string) bool {
	digit := func(s string) bool { return strings.ContainsAny(s, "0123456789") }
	if len(ids) < 2 || digit(ids[0]) {
		return false
	}
	n := 0
	for _, id := range ids[1:] {
		if digit(id) {
			n++
		}
	}
	return 2*n >= len(ids)-1
}

// idRow and idHeading are [notAnID] and [headingFirst] as readIDs calls them: variables, so
// that a test can swap in their broken variants (members_file_test.go).
var (
	idRow     = notAnID
	idHeading = headingFirst
)

// readMembers reads the member ids of path for grant and campaign audience: one a line
// ([readIDs]), or, with column set, the column of that name of a CSV with a header
// ([readColumn]). Every error names the file and the line.
func readMembers(path, column string, w io.Writer) ([]string, error) {
	if column = strings.TrimSpace(column); column != "" {
		return readColumn(path, column, ids.Member, w)
	}
	list, err := readIDs(path, ids.Member, w)
	if errors.Is(err, errNotAnID) {
		err = fmt.Errorf("%w; for a CSV with a heading line, or a member id that reads as a heading, give the file a heading line and --csv-column NAME (the column of the member ids)", err)
	}
	return list, err
}

// readColumn reads the column named column (its heading trimmed, as written) of the CSV file at
// path, its first record the headings, a UTF-8 byte order mark before it skipped with a note on
// w, and checks each cell (trimmed) with check. It refuses, naming the line: a file without the
// column (listing the headings it has), a row without a value in it, a value check refuses, a
// row that is not CSV (a stray quote, a row of another length), and a file without a row.
func readColumn(path, column string, check func(string) error, w io.Writer) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	in := bufio.NewReader(f)
	if b, _ := in.Peek(len(utf8BOM)); string(b) == utf8BOM {
		_, _ = in.Discard(len(utf8BOM))
		fmt.Fprintf(w, "%s: skipped the UTF-8 byte order mark (BOM) before line 1\n", path)
	}
	r := csv.NewReader(in)
	r.ReuseRecord = true
	col, err := columnOf(path, r, column)
	if err != nil {
		return nil, err
	}
	var list []string
	for {
		rec, err := r.Read()
		if err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		line, _ := r.FieldPos(col)
		cell := strings.TrimSpace(rec[col])
		switch {
		case cell == "":
			return nil, fmt.Errorf("%s:%d: no value in column %q", path, line, column)
		case cell == column:
			return nil, fmt.Errorf("%s:%d: the headings again (files joined?): remove the line", path, line)
		}
		if err := check(cell); err != nil {
			return nil, fmt.Errorf("%s:%d: column %q: %w", path, line, column, err)
		}
		list = append(list, cell)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%s: no rows under the headings", path)
	}
	return list, nil
}
