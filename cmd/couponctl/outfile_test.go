package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/mops/coupon-api/internal/ops/campaign"
)

// TestGrantOutRefusesWhatItWouldReplace: an --out that is a symbolic link, a directory or a FIFO
// is refused before anything is issued, naming what it is, and is left as it was (before, the
// CSV was renamed over the link and the FIFO, and a directory was found only after the grant).
// A default --out lands in the working directory, not beside FILE; --dry-run issues nothing and
// writes no CSV. Each shown red on its broken variant: an --out check that accepts anything
// (the CSV renamed over the link and the FIFO, the directory found after the grant), the
// default CSV beside FILE (in /dev for --members /dev/stdin), a --dry-run not honoured.
func TestGrantOutRefusesWhatItWouldReplace(t *testing.T) {
	dryRun := "--dry-run"
	checkAndBreak(t, func(t *testing.T, v *verdict) { grantOutCheck(t, v, dryRun) },
		brokenVariant{"--out checked for nothing", func(t *testing.T) { swap(t, &outCheck, checkOutNothing) }},
		brokenVariant{"default --out beside FILE", func(t *testing.T) { swap(t, &outDefault, defaultOutBesideInput) }},
		brokenVariant{"--dry-run not honoured", func(t *testing.T) { swap(t, &dryRun, "--dry-run=false") }})
}

// checkOutNothing is checkOut's broken variant: every --out is taken, whatever it is.
func checkOutNothing(string) error { return nil }

// defaultOutBesideInput is defaultOut's broken variant: the CSV beside FILE, which may be in /dev.
func defaultOutBesideInput(input, suffix string) string { return input + suffix }

// grantOutCheck runs grant with each kind of --out that must be refused, then with the default
// --out, with and without dryRun (the flag that makes a dry run), and records what went wrong.
func grantOutCheck(t *testing.T, v *verdict, dryRun string) {
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
				args = append(args, dryRun)
			}
			code, stdout, stderr := grantCLI(args...)
			if code != 1 || !strings.Contains(stderr, "couponctl: grant: --out "+c.out+" "+c.kind) || !strings.Contains(stderr, "nothing was issued") {
				v.Errorf("%q: exit %d, want 1 saying %q\n%s%s", args, code, c.kind, stdout, stderr)
			}
			if fi, err := os.Lstat(c.out); err != nil {
				v.Errorf("%s after the grant: %v; want it left as %v", c.out, err, c.mode)
			} else if fi.Mode().Type() != c.mode {
				v.Errorf("%s after the grant: %v; want it left as %v", c.out, fi.Mode(), c.mode)
			}
		}
	}
	if b, err := os.ReadFile(target); err != nil || string(b) != "keep me\n" {
		v.Errorf("the link's target holds %q (%v), want it untouched", b, err)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`); n != 0 {
		v.Errorf("%d coupons issued by refused grants", n)
		return
	}

	work := t.TempDir()
	t.Chdir(work)
	code, stdout, stderr := grantCLI("grant", "--campaign", "OUT", "--members", members, dryRun)
	if code != 0 || !strings.Contains(stdout, "dry run: 3 members would be sent") {
		v.Errorf("--dry-run: exit %d\n%s%s", code, stdout, stderr)
	}
	if n := d.count(t, `SELECT count(*) FROM issued_coupons`); n != 0 {
		v.Errorf("--dry-run issued %d coupons", n)
	}
	if _, err := os.Lstat(filepath.Join(work, "members.txt.OUT.csv")); err == nil {
		v.Errorf("--dry-run wrote the CSV")
	}
	if code, stdout, stderr := grantCLI("grant", "--campaign", "OUT", "--members", members); code != 0 {
		v.Errorf("grant: exit %d\n%s%s", code, stdout, stderr)
	}
	if _, err := os.Lstat(filepath.Join(work, "members.txt.OUT.csv")); err != nil {
		v.Errorf("no default CSV in the working directory: %v", err)
	} else if got := readGrantCSV(t, filepath.Join(work, "members.txt.OUT.csv")); len(got) != 3 {
		v.Errorf("the default CSV in the working directory holds %d members, want 3", len(got))
	}
	if _, err := os.Lstat(members + ".OUT.csv"); err == nil {
		v.Errorf("the default CSV was written beside FILE, outside the working directory")
	}
}
