package localpg

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestExplicitBinDirWithoutBinaries: a PG_BIN_DIR that holds no initdb is an error that names
// it, never a silent fall-back to other binaries.
func TestExplicitBinDirWithoutBinaries(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("PG_BIN_DIR", empty)
	srv, err := Start(context.Background(), Options{})
	if err == nil {
		_ = srv.Stop()
		t.Fatalf("PG_BIN_DIR=%s: started %s from %s, want an error", empty, srv.Version(), srv.BinDir())
	}
	if !errors.Is(err, ErrBinariesMissing) || !strings.Contains(err.Error(), "PG_BIN_DIR="+empty) {
		t.Errorf("PG_BIN_DIR=%s: %v, want ErrBinariesMissing naming PG_BIN_DIR", empty, err)
	}
}

// TestReportsBinaries: a started server says which binaries it runs and their version.
func TestReportsBinaries(t *testing.T) {
	t.Setenv("PG_BIN_DIR", "")
	srv, err := Start(context.Background(), Options{})
	if errors.Is(err, ErrBinariesMissing) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	if srv.BinDir() == "" || !strings.HasPrefix(srv.Version(), "postgres (PostgreSQL) ") {
		t.Errorf("BinDir %q, Version %q: want the directory and `postgres --version`", srv.BinDir(), srv.Version())
	}
}
