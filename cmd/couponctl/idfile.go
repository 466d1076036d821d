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
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		text := sc.Text()
		if n == 1 {
			var bom bool
			if text, bom = idTrimBOM(text); bom {
				fmt.Fprintf(w, "%s: skipped the UTF-8 byte order mark (BOM) before line 1\n", path)
			}
		}
		if why := idEncoding(text); why != "" {
			return nil, fmt.Errorf("%s:%d: %s", path, n, why)
		}
		line := strings.TrimSpace(text)
		if line == "" || idComment(line) {
			continue
		}
		if err := idRow(line, len(ids) == 0); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		if err := check(line); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		ids = append(ids, line)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("%s: no ids in it", path)
	}
	return ids, nil
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

// rowSeparators are the characters of a CSV or TSV row that [notAnID] refuses in a line.
const rowSeparators = ",;\t\""

// headings are the column headings (lower case) that [notAnID] refuses as the first id of a file.
var headings = []string{"id", "ids", "member", "members", "member_id", "memberid", "member id",
	"coupon", "coupon_id", "couponid", "line_user_id", "customer_id", "user_id", "userid"}

// notAnID refuses line, a trimmed line of an id file that is not a comment (first: the first
// such line), when it holds a separator of a row or is a column heading: [errNotAnID], saying
// which.
func notAnID(line string, first bool) error {
	if i := strings.IndexAny(line, rowSeparators); i >= 0 {
		return fmt.Errorf("%q holds %q: %w", line, line[i:i+1], errNotAnID)
	}
	if first && slices.Contains(headings, strings.ToLower(line)) {
		return fmt.Errorf("%q is a column heading: %w", line, errNotAnID)
	}
	return nil
}

// idRow is [notAnID] as readIDs calls it: a variable, so that a test can swap in its broken
// variant (members_file_test.go).
var idRow = notAnID

// readMembers reads the member ids of path for grant and campaign audience: one a line
// ([readIDs]), or, with column set, the column of that name of a CSV with a header
// ([readColumn]). Every error names the file and the line.
func readMembers(path, column string, w io.Writer) ([]string, error) {
	if column != "" {
		return readColumn(path, column, ids.Member, w)
	}
	list, err := readIDs(path, ids.Member, w)
	if errors.Is(err, errNotAnID) {
		err = fmt.Errorf("%w; for a CSV with a header, --csv-column NAME reads the member ids of its column NAME", err)
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
	head, err := r.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%s: empty: --csv-column wants a CSV whose first line holds the headings", path)
	} else if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	col := slices.IndexFunc(head, func(h string) bool { return strings.TrimSpace(h) == column })
	if col < 0 {
		return nil, fmt.Errorf("%s:1: no column %q; its headings are %q", path, column, head)
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
		if cell == "" {
			return nil, fmt.Errorf("%s:%d: no value in column %q", path, line, column)
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
