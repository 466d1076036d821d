package console

import (
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
)

// TestDeployedMainVerifiesAgainstItsKeyURL runs the deployable main (console/cmd) as Cloud Run
// runs coupon-console: IAP_AUDIENCE, the keys fetched from IAP_JWKS_URL (here a local server
// serving the test's JWK set, where Google's is deployed), a coupon_console login. A request
// without an assertion is 401, one with a valid assertion gets the list; SIGTERM drains it.
// Without IAP_AUDIENCE, or with CONSOLE_CSRF_KEY not 64 hex digits, it exits 1 naming it.
func TestDeployedMainVerifiesAgainstItsKeyURL(t *testing.T) {
	p := newIDP(t)
	keys, err := os.ReadFile(p.file)
	if err != nil {
		t.Fatal(err)
	}
	jwks := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(keys)
	}))
	defer jwks.Close()
	dbURL := pgtest.LoginAs(t, pgtest.URL(t), "coupon_console")
	bin := proctest.Build(t, "./cmd")

	for _, tc := range []struct{ env, want string }{
		{"IAP_AUDIENCE=", "IAP_AUDIENCE"},
		{"CONSOLE_CSRF_KEY=abc", "CONSOLE_CSRF_KEY"},
	} {
		cmd, out := proctest.Start(t, bin, "DATABASE_URL="+dbURL, "PORT="+proctest.FreePort(t), "IAP_JWKS_URL="+jwks.URL,
			"IAP_AUDIENCE="+testAudience, tc.env)
		if err := cmd.Wait(); err == nil || !strings.Contains(out.String(), tc.want) {
			t.Errorf("%s: %v, %q; want exit 1 naming %s", tc.env, err, out.String(), tc.want)
		}
	}

	port := proctest.FreePort(t)
	cmd, out := proctest.Start(t, bin, "DATABASE_URL="+dbURL, "PORT="+port, "IAP_JWKS_URL="+jwks.URL, "IAP_AUDIENCE="+testAudience)
	proctest.WaitServing(t, port, out)
	get := func(assertion string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://127.0.0.1:"+port+"/", nil)
		if assertion != "" {
			req.Header.Set(AssertionHeader, assertion)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := get(""); got != http.StatusUnauthorized {
		t.Errorf("no assertion: %d, want 401", got)
	}
	if got := get(p.assertion(t, viewerEmail)); got != http.StatusOK {
		t.Errorf("a valid assertion: %d, want 200\n%s", got, out.String())
	}
	if got := get(newIDP(t).assertion(t, viewerEmail)); got != http.StatusUnauthorized {
		t.Errorf("an assertion signed by another key: %d, want 401", got)
	}
	proctest.Terminate(t, cmd, out)
}
