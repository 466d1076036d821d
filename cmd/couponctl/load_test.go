package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestLoadRefusesAURLThatIsNotIssueCoupon: a URL that answers 404 (the root of a serve that
// serves both functions) is refused after one probe, naming the path to use, before any load.
func TestLoadRefusesAURLThatIsNotIssueCoupon(t *testing.T) {
	var hits int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits++
		http.NotFound(w, nil)
	}))
	defer srv.Close()
	out, err := couponctl("load", "--url", srv.URL+"/", "--duration", "1s", "--clients", "4")
	if err == nil || !strings.Contains(err.Error(), "/IssueCoupon") || hits != 1 {
		t.Errorf("load on a 404 URL: %v (%d requests)\n%s\nwant refused after one probe, naming /IssueCoupon", err, hits, out)
	}
}
