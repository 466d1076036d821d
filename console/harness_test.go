package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/golang-jwt/jwt/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/functions/issue"
	"github.com/mops/coupon-api/internal/ops/campaign"
	"github.com/mops/coupon-api/internal/testkit/pgtest"
	"github.com/mops/coupon-api/internal/testkit/proctest"
	"github.com/mops/coupon-api/shared/issuance"
)

// TestMain runs the tests on a throwaway PostgreSQL, with the log (IssueCoupon's line per
// request under the load) discarded.
func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler))
	pgtest.Main(m, proctest.RemoveBuilds)
}

// testAudience is the audience the test console expects, as IAP_AUDIENCE is deployed.
const testAudience = "/projects/1234567890/locations/asia-northeast1/services/coupon-console"

// The people of the tests, by console role (console_role_set).
const (
	viewerEmail    = "viewer@example.co.jp"
	operatorEmail  = "operator@example.co.jp"
	approverEmail  = "approver@example.co.jp"
	approver2Email = "approver2@example.co.jp"
)

// idp is a stand-in for IAP: an ES256 key whose public half is the JWK set file the console
// verifies with (as Google's keys are deployed), signing assertions for the test's people.
type idp struct {
	key  *ecdsa.PrivateKey
	kid  string
	file string
}

func newIDP(t testing.TB) *idp {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	p := &idp{key: key, kid: "test-" + rand.Text()[:8], file: filepath.Join(t.TempDir(), "iap-jwk.json")}
	writeJWKSet(t, p.file, p.kid, &key.PublicKey)
	return p
}

// writeJWKSet writes pub as a JWK set (RFC 7517), the form Google serves IAP's keys in.
func writeJWKSet(t testing.TB, file, kid string, pub *ecdsa.PublicKey) {
	t.Helper()
	b64 := func(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }
	raw, err := pub.Bytes() // uncompressed point: 0x04 || X || Y
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]any{"keys": []map[string]string{{"kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig",
		"kid": kid, "x": b64(raw[1:33]), "y": b64(raw[33:65])}}}
	body, err := json.Marshal(set)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, body, 0o600); err != nil {
		t.Fatal(err)
	}
}

// assertion is an IAP assertion for email, as IAP signs one: ES256, the audience, the issuer,
// issued now, valid 10 minutes. edit changes the claims before signing (a forged one).
func (p *idp) assertion(t testing.TB, email string, edit ...func(jwt.MapClaims)) string {
	t.Helper()
	now := time.Now()
	claims := jwt.MapClaims{"iss": IAPIssuer, "aud": testAudience, "sub": "accounts.google.com:" + email,
		"email": email, "iat": now.Unix(), "exp": now.Add(10 * time.Minute).Unix()}
	for _, e := range edit {
		e(claims)
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodES256, claims)
	tok.Header["kid"] = p.kid
	s, err := tok.SignedString(p.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// env is one test's world: a migrated PostgreSQL, the console serving on it as a coupon_console
// login, IssueCoupon serving on it as a coupon_issue login, the people with their roles.
type env struct {
	owner   *pgxpool.Pool // the database's owner: setup and the counts by SQL
	idp     *idp
	srv     *server // the console behind e.console
	console *httptest.Server
	issue   *httptest.Server
}

// identityOf builds the identifier the console trusts: a variable, so that a check can run
// against the broken variant that trusts an unsigned header (trustsEmailHeader).
type identityOf func(t testing.TB, p *idp) Identifier

func verifiedIAP(t testing.TB, p *idp) Identifier {
	t.Helper()
	v, err := NewIAPFromFile(p.file, testAudience)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func setup(t testing.TB, identity identityOf) *env {
	t.Helper()
	ctx := context.Background()
	ownerURL := pgtest.URL(t)
	owner, err := pgxpool.New(ctx, ownerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(owner.Close)
	for email, role := range map[string]string{viewerEmail: "viewer", operatorEmail: "operator",
		approverEmail: "approver", approver2Email: "approver"} {
		if _, err := owner.Exec(ctx, `SELECT count(*) FROM console_role_set($1, $2, 'browser test')`, email, role); err != nil {
			t.Fatal(err)
		}
	}
	consolePool, err := pgxpool.New(ctx, pgtest.LoginAs(t, ownerURL, "coupon_console"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(consolePool.Close)
	issuePool, err := pgxpool.New(ctx, pgtest.LoginAs(t, ownerURL, "coupon_issue"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(issuePool.Close)

	e := &env{owner: owner, idp: newIDP(t)}
	srv, h, err := newServer(Config{Pool: consolePool, Identity: identity(t, e.idp), Plaintext: true})
	e.srv = srv
	if err != nil {
		t.Fatal(err)
	}
	e.console = httptest.NewServer(h)
	t.Cleanup(e.console.Close)
	ih, err := issue.New(issuance.Config{}, issuePool)
	if err != nil {
		t.Fatal(err)
	}
	e.issue = httptest.NewServer(ih)
	t.Cleanup(e.issue.Close)
	return e
}

func (e *env) createCampaign(t testing.TB, c campaign.Campaign) {
	t.Helper()
	if err := campaign.Create(context.Background(), e.owner, c); err != nil {
		t.Fatal(err)
	}
}

// count runs a SELECT count(*)-like query on the owner's pool.
func (e *env) count(t testing.TB, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.owner.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

// issueCoupon asks IssueCoupon for member's coupon of campaignID and returns the answer's
// result and coupon_id.
func (e *env) issueCoupon(t testing.TB, member, campaignID string) (result, couponID string) {
	t.Helper()
	r, id, err := e.ask(member, campaignID)
	if err != nil {
		t.Fatal(err)
	}
	return r, id
}

func (e *env) ask(member, campaignID string) (result, couponID string, err error) {
	body := fmt.Sprintf(`{"member_id": %q, "campaign_id": %q}`, member, campaignID)
	resp, err := http.Post(e.issue.URL, "application/json", strings.NewReader(body))
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	var out struct {
		Result   string `json:"result"`
		CouponID string `json:"coupon_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return "", "", err
	}
	return out.Result, out.CouponID, nil
}

// load is IssueCoupon serving workers that ask for campaignID for new members, one after
// another, until stopped; answers counts the answers by result.
type load struct {
	stop    context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers map[string]int
	total   atomic.Int64
}

func (e *env) startLoad(t testing.TB, campaignID string, workers int) *load {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	l := &load{stop: stop, answers: map[string]int{}}
	var next atomic.Int64
	start := make(chan struct{})
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			<-start
			for ctx.Err() == nil {
				r, _, err := e.ask(fmt.Sprintf("load-%d-%d", w, next.Add(1)), campaignID)
				if err != nil {
					r = "error: " + err.Error()
				}
				l.mu.Lock()
				l.answers[r]++
				l.mu.Unlock()
				l.total.Add(1)
			}
		}()
	}
	close(start) // released together
	t.Cleanup(l.halt)
	return l
}

func (l *load) halt() { l.stop(); l.wg.Wait() }

// waitAnswers waits until the load has had n more answers than it had at the call.
func (l *load) waitAnswers(t testing.TB, n int64) {
	t.Helper()
	from := l.total.Load()
	pgtest.Eventually(t, pgtest.PollTimeout, func() error {
		if got := l.total.Load() - from; got < n {
			return fmt.Errorf("the load answered %d requests, want %d", got, n)
		}
		return nil
	})
}

// browser is one headless chromium for a test; each person browses in a browser context of
// their own (cookies apart), with their IAP assertion on every request, and every script
// exception or console error of any page fails the test.
type browser struct {
	ctx    context.Context
	mu     sync.Mutex
	thrown []string
}

// chromiumPath finds Debian's chromium. Absent, the test is skipped with a message, unless CI
// is set (CI installs chromium): then it fails.
func chromiumPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed, and CI is set: the browser tests must run in CI (apt-get install -y chromium)")
	}
	t.Skip("chromium is not installed: the console's browser tests need it (apt-get install -y chromium); CI runs them")
	return ""
}

func newBrowser(t testing.TB) *browser {
	t.Helper()
	// chromium's singleton socket lives in its TMPDIR, and a Unix socket's path is at most 107
	// bytes: a short directory of its own (t.TempDir's names are long), removed at the end.
	tmp, err := os.MkdirTemp("", "cr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 1000), chromedp.Flag("lang", "ja-JP"),
		chromedp.UserDataDir(filepath.Join(tmp, "profile")), chromedp.Env("TMPDIR="+tmp))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		cancel()
		cancelAlloc()
		t.Fatalf("start chromium: %v", err)
	}
	b := &browser{ctx: ctx}
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
		b.mu.Lock()
		defer b.mu.Unlock()
		for _, e := range b.thrown {
			t.Errorf("a page threw or logged an error: %s", e)
		}
	})
	return b
}

// as opens a browser context for a person: assertion is sent as X-Goog-IAP-JWT-Assertion on
// every request ("" sends none). Every exception and console error of its pages is kept, and
// fails the test at its end; the browser's own line for a page answered 4xx is not an error of
// the page (some tests expect a refusal).
func (b *browser) as(t testing.TB, assertion string) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.IsException() || m.Type == chromedp.ConsoleError && !expectedRefusal.MatchString(m.Text) {
				b.mu.Lock()
				b.thrown = append(b.thrown, fmt.Sprintf("%s: %s", m.URL, m.Text))
				b.mu.Unlock()
			}
		}
	}()
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if assertion != "" {
		if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders,
			network.SetExtraHTTPHeadersParams{Headers: network.Headers{AssertionHeader: assertion}}); err != nil {
			t.Fatal(err)
		}
	}
	return ctx
}

// expectedRefusal is the browser's log line for a page answered 401, 403 or 409.
var expectedRefusal = regexp.MustCompile(`status of 40[139]`)

// do runs browser steps within a bound, failing the test on an error.
func do(t testing.TB, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// get runs a browser action with a value within a bound, failing the test on an error.
func get[T any](t testing.TB, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// open navigates to the console's path and waits for the page's footer (every page has one).
func (e *env) open(t testing.TB, ctx context.Context, path string) {
	t.Helper()
	do(t, ctx, chromedp.Navigate(e.console.URL+path))
}

// submit fills a form of the page (by its data-action, within scope) and presses its button,
// waiting for the page it leads to. A field valued "on" is a checkbox to tick.
func submit(t testing.TB, ctx context.Context, action, scope string, fields map[string]string) {
	t.Helper()
	form := strings.TrimSpace(fmt.Sprintf(`%s form[data-action=%q]`, scope, action))
	var steps []chromedp.Action[chromedp.Void]
	for name, v := range fields {
		sel := chromedp.CSS(fmt.Sprintf(`%s [name=%q]`, form, name))
		if v == "on" {
			steps = append(steps, chromedp.Click(sel))
			continue
		}
		steps = append(steps, chromedp.SendKeys(sel, v))
	}
	do(t, ctx, steps...)
	if _, err := chromedp.RunResponse(ctx, chromedp.Click(chromedp.CSS(form+" button"))); err != nil {
		t.Fatalf("submit %s: %v", action, err)
	}
}

// formActions are the data-action values of the forms on the page.
func formActions(t testing.TB, ctx context.Context) []string {
	t.Helper()
	return get(t, ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll("form[data-action]")).map(f => f.dataset.action)`))
}

// pageText is the text of the page's body.
func pageText(t testing.TB, ctx context.Context) string {
	t.Helper()
	return get(t, ctx, chromedp.Evaluate[string](`document.body.innerText`))
}

// screenshot saves the page as docs/console/name.png when CONSOLE_SCREENSHOTS is set.
func screenshot(t testing.TB, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("CONSOLE_SCREENSHOTS") == "" {
		return
	}
	png := get(t, ctx, chromedp.FullScreenshot(100))
	file := filepath.Join("..", "docs", "console", name+".png")
	if err := os.WriteFile(file, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", file)
}

// client is a plain HTTP client with a cookie jar, for the requests a browser would not send
// (forged ones).
func client(t testing.TB) *http.Client {
	t.Helper()
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// do sends method to the console's path with assertion (none when "") and form, and returns
// the status and body.
func (e *env) do(t testing.TB, c *http.Client, method, path, assertion string, form url.Values, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, e.console.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Origin", e.console.URL)
	}
	if assertion != "" {
		req.Header.Set(AssertionHeader, assertion)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

var csrfInput = regexp.MustCompile(`name="` + CSRFField + `" value="([^"]+)"`)

// csrfToken is the CSRF token of the first form of body.
func csrfToken(t testing.TB, body string) string {
	t.Helper()
	m := csrfInput.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s field in the page", CSRFField)
	}
	return m[1]
}
