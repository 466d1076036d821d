package console

import (
	"cmp"
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gorilla/csrf"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mops/coupon-api/shared/lifecycle"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// CSRFField is the form field that carries the CSRF token on every action form (the contract's
// hook).
const CSRFField = "csrf_token"

// csrfKeyLen is the size of the key the CSRF cookie is authenticated with (gorilla/csrf: 32
// bytes).
const csrfKeyLen = 32

// Config is what [New] builds the console from.
type Config struct {
	// Pool is the database, logged in as a member of coupon_console.
	Pool *pgxpool.Pool
	// Identity names the person behind each request: [IAP] deployed and in tests, [Operator]
	// for a loopback console of one person.
	Identity Identifier
	// CSRFKey authenticates the CSRF cookie, 32 bytes; every instance of one deployment needs the
	// same key. Nil: a random key, valid for this process only.
	CSRFKey []byte
	// Plaintext says the console is reached over plain HTTP (a loopback console): its cookies
	// lose Secure, and a POST's Origin is compared with http://, not https://.
	Plaintext bool
	// Log gets the detail of unexpected errors. Default slog.Default().
	Log *slog.Logger
}

// New returns the console's handler: every request identified ([Config.Identity]; 401 and
// nothing done otherwise), every POST checked for its CSRF token (403 otherwise), every answer
// with a Content Security Policy that allows no script.
func New(c Config) (http.Handler, error) {
	_, h, err := newServer(c)
	return h, err
}

// newServer is [New], with the server behind the handler (tests reach its cache).
func newServer(c Config) (*server, http.Handler, error) {
	if c.Pool == nil || c.Identity == nil {
		return nil, nil, errors.New("console: a pool and an identity are required")
	}
	key := c.CSRFKey
	if key == nil {
		key = make([]byte, csrfKeyLen)
		if _, err := rand.Read(key); err != nil {
			return nil, nil, err
		}
	}
	if len(key) != csrfKeyLen {
		return nil, nil, fmt.Errorf("console: the CSRF key is %d bytes, want %d", len(key), csrfKeyLen)
	}
	tmpl, err := template.New("").Funcs(funcs).ParseFS(templateFiles, "templates/*.html")
	if err != nil {
		return nil, nil, err
	}
	log := c.Log
	if log == nil {
		log = slog.Default()
	}
	s := &server{reads: &reads{pool: c.Pool, redeemed: sqlRedeemed, pending: sqlPending}, actions: &actions{pool: c.Pool}, tmpl: tmpl, log: log}
	protect := csrf.Protect(key, csrf.Secure(!c.Plaintext), csrf.SameSite(csrf.SameSiteStrictMode),
		csrf.FieldName(CSRFField), csrf.Path("/"), csrf.CookieName("console_csrf"),
		csrf.ErrorHandler(http.HandlerFunc(s.csrfRefused)))(s.routes())
	var h http.Handler = protect
	if c.Plaintext {
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { protect.ServeHTTP(w, csrf.PlaintextHTTPRequest(r)) })
	}
	h = identify(c.Identity, log, h)
	if _, ok := c.Identity.(Operator); ok {
		h = loopbackHostOnly(log, h)
	}
	return s, securityHeaders(h), nil
}

// loopbackHostOnly answers 421 Misdirected Request to a request whose Host is not a loopback
// name (127.0.0.1, localhost, [::1], with or without a port), before anything reads or changes.
// An [Operator] console serves whoever reaches it as the operator: without this, a page of
// another site whose name is rebound to 127.0.0.1 (DNS rebinding) would be same-origin with
// its own Host, pass the CSRF check with its own Origin and act as the operator.
func loopbackHostOnly(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := r.Host
		if h, _, err := net.SplitHostPort(r.Host); err == nil {
			host = h
		}
		host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
		if ip := net.ParseIP(host); !strings.EqualFold(host, "localhost") && (ip == nil || !ip.IsLoopback()) {
			log.Info("console: request refused", "path", r.URL.Path, "host", r.Host, "reason", "not a loopback host")
			http.Error(w, "421 Misdirected Request: --operator のコンソールは 127.0.0.1、localhost、[::1] の名前でだけ開けます。", http.StatusMisdirectedRequest)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// securityHeaders sets, on every answer, a Content Security Policy with no script at all (the
// pages have none: the chart is drawn on the server as SVG), no framing, and no caching.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self'; "+
			"form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

type personKey struct{}

// identify answers 401 to a request whose person id cannot name, before anything reads or
// changes; otherwise it passes the request on with the person's email in its context.
func identify(id Identifier, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		email, err := id.Identify(r)
		if err != nil {
			log.Info("console: request refused", "path", r.URL.Path, "reason", err.Error())
			http.Error(w, "401 Unauthorized: Identity-Aware Proxy の署名付きヘッダー（"+AssertionHeader+"）がないか、検証できません。", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), personKey{}, email)))
	})
}

// person is the email [identify] verified.
func person(r *http.Request) string { return r.Context().Value(personKey{}).(string) }

// Function is the console as Cloud Run's coupon-console service runs it ([lifecycle.Main] in
// console/cmd): IAP assertions verified against Google's keys for IAP_AUDIENCE.
var Function = lifecycle.NewFunction("Console", open, func(w http.ResponseWriter, status int) {
	http.Error(w, http.StatusText(status), status)
})

// open builds the deployed console from the environment: IAP_AUDIENCE (required: the audience
// IAP signs for this service), IAP_JWKS_URL (default [GoogleIAPKeys]), CONSOLE_CSRF_KEY (64 hex
// digits, the same on every instance), and the database as every function opens it.
func open(ctx context.Context) (*lifecycle.Instance, error) {
	jwks := cmp.Or(os.Getenv("IAP_JWKS_URL"), GoogleIAPKeys)
	audience := os.Getenv("IAP_AUDIENCE")
	key, err := csrfKeyFromEnv()
	if err != nil {
		return nil, err
	}
	// The keys are refreshed for the instance's life, not the start-up's.
	idp, err := NewIAP(context.WithoutCancel(ctx), jwks, audience)
	if err != nil {
		return nil, err
	}
	d, err := lifecycle.OpenDB(ctx)
	if err != nil {
		return nil, err
	}
	h, err := New(Config{Pool: d.Pool, Identity: idp, CSRFKey: key})
	return d.Serving(h, err, "iap_audience", audience, "iap_jwks", jwks)
}

// csrfKeyFromEnv reads CONSOLE_CSRF_KEY: 64 hex digits, or unset for a key of this instance
// alone (a form loaded from one instance is then refused by another).
func csrfKeyFromEnv() ([]byte, error) {
	v := os.Getenv("CONSOLE_CSRF_KEY")
	if v == "" {
		return nil, nil
	}
	key, err := hex.DecodeString(v)
	if err != nil || len(key) != csrfKeyLen {
		return nil, fmt.Errorf("CONSOLE_CSRF_KEY: want %d hex digits (openssl rand -hex %d)", 2*csrfKeyLen, csrfKeyLen)
	}
	return key, nil
}

// static serves the embedded stylesheet and icon; a directory (/static/) is 404, not a listing.
func (s *server) static() http.Handler {
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		panic(err) // the embed above guarantees the directory
	}
	files := http.StripPrefix("/static/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/") {
			s.notFound(w, r)
			return
		}
		files.ServeHTTP(w, r)
	})
}

// tokyoTime writes t as the team reads a time, Asia/Tokyo to the minute: 2026/12/07（月）19:23.
func tokyoTime(t time.Time) string {
	t = t.In(tokyo)
	return fmt.Sprintf("%s（%s）%s", t.Format("2006/01/02"), weekdayJa[t.Weekday()], t.Format("15:04"))
}

// weekdayJa are the days of the week as a Japanese date writes them, Sunday first.
var weekdayJa = [...]string{"日", "月", "火", "水", "木", "金", "土"}
