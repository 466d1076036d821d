package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/mops/coupon-api/internal/campaign"
)

// TestGrantOutRefusesWhatItWouldReplace: an --out that is a symbolic link, a directory or a FIFO
// is refused before anything is issued, naming what it is, and is left as it was (before, the
// CSV was renamed over the link and the FIFO, and a directory was found only after the grant).
// A default --out lands in the working directory, not beside FILE; --dry-run issues nothing and
// writes no CSV.
func TestGrantOutRefusesWhatItWouldReplace(t *testing.T) {
	d := newGrantDB(t, campaign.Campaign{ID: "OUT", DiscountYen: 500, BudgetYen: 1_000_000})
	t.Setenv("DATABASE_URL", d.admin)
	members, _ := memberFile(t, "o", 3)
	dir := t.TempDir()
	target := filepath.Join(dir, "target.txt")
	if err := os.WriteFile(target, []byte("keep me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.csv")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.csv")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		out, kind string
		mode      os.FileMode
	}{
		{link, "is a symbolic link", os.ModeSymlink},
		{sub, "is a directory", os.ModeDir},
		{fifo, "is a FIFO", os.ModeNamedPipe},
	} {
		for _, dry := range []bool{false, true} {
			args := []string{"grant", "--campaign", "OUT", "--members", members, "--out", c.out}
			if dry {
				args = append(args, "--dry-run")
			}
			code, stdout, stderr := grantCLI(args...)
			if code != 1 || !strings.Contains(stderr, "couponctl: grant: --out "+c.out+" "+c.kind) || !strings.Contains(stderr, "nothing was issued") {
				t.Errorf("%q: exit %d, want 1 saying %q\n%s%s", args, code, c.kind, stdout, stderr)
			}
			fi, err := os.Lstat(c.out)
			if err != nil || fi.Mode().Type() != c.mode {
				t.Errorf("%s after the grant: %v, %v; want left as %v", c.out, fi.Mode(), err, c.mode)
			}
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep me\n" {
		t.Errorf("the link's target holds %q (%v), want it untouched", b, err)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`); n != 0 {
		t.Fatalf("%d coupons issued by refused grants", n)
	}

	work := t.TempDir()
	t.Chdir(work)
	code, stdout, stderr := grantCLI("grant", "--campaign", "OUT", "--members", members, "--dry-run")
	if code != 0 || !strings.Contains(stdout, "dry run: 3 members would be sent") {
		t.Errorf("--dry-run: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`); n != 0 {
		t.Errorf("--dry-run issued %d coupons", n)
	}
	if _, err := os.Lstat(filepath.Join(work, "members.txt.OUT.csv")); err == nil {
		t.Errorf("--dry-run wrote the CSV")
	}
	if code, stdout, stderr := grantCLI("grant", "--campaign", "OUT", "--members", members); code != 0 {
		t.Fatalf("grant: exit %d\n%s%s", code, stdout, stderr)
	}
	if got := readGrantCSV(t, filepath.Join(work, "members.txt.OUT.csv")); len(got) != 3 {
		t.Errorf("the default CSV in the working directory holds %d members, want 3", len(got))
	}
	if _, err := os.Lstat(members + ".OUT.csv"); err == nil {
		t.Errorf("the default CSV was written beside FILE, outside the working directory")
	}
}
