package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"
)

// IAP's signed header and the values its assertion carries (Google Cloud docs, "Securing your
// app with signed headers").
const (
	// AssertionHeader is the header IAP adds to every request it lets through.
	AssertionHeader = "X-Goog-IAP-JWT-Assertion"
	// IAPIssuer is the iss of every IAP assertion.
	IAPIssuer = "https://cloud.google.com/iap"
	// GoogleIAPKeys is the JWK set IAP signs its assertions with (ES256 keys, rotated by Google).
	GoogleIAPKeys = "https://www.gstatic.com/iap/verify/public_key-jwk"
	// clockLeeway is the clock skew allowed on exp and iat, as Google's own verifier allows.
	clockLeeway = 30 * time.Second
	// maxLifetime is the longest an IAP assertion may live, exp minus iat: IAP signs each for 10
	// minutes, and the same docs allow the skew at both ends ("10 minutes + 2 * skew").
	maxLifetime = 10*time.Minute + 2*clockLeeway
)

// ErrNoIdentity is wrapped by every refusal of [Identifier.Identify]: the request carries no
// valid assertion. The console answers it 401 and changes nothing.
var ErrNoIdentity = errors.New("console: no valid IAP assertion")

// Identifier names the person behind a request: the email the console records in history.
type Identifier interface {
	Identify(r *http.Request) (email string, err error)
}

// IAP verifies the X-Goog-IAP-JWT-Assertion of every request: an ES256 JWT signed by a key of
// its JWK set, for its audience, issued by [IAPIssuer], not expired; the person is its email
// claim. Deployed the keys are Google's ([NewIAP] with [GoogleIAPKeys], refreshed as Google
// rotates them); locally and in tests a JWK set file ([NewIAPFromFile]): the same verification.
type IAP struct {
	keys     jwt.Keyfunc
	audience string
	// lifetime judges the verified assertion's iat and exp: [lifetimeOfIAP]. A field so that a
	// test can keep its broken variant (browser_test.go).
	lifetime func(iat, exp *jwt.NumericDate) error
}

// lifetimeOfIAP refuses an assertion without iat, or one that lives longer than [maxLifetime]
// (exp 30 years ahead, say): jwt checks iat only when it is there, and any exp to come.
func lifetimeOfIAP(iat, exp *jwt.NumericDate) error {
	switch {
	case iat == nil:
		return errors.New("the assertion has no iat (IAP always sets it)")
	case exp.Sub(iat.Time) > maxLifetime:
		return fmt.Errorf("the assertion lives %s (iat to exp), longer than IAP's %s", exp.Sub(iat.Time), maxLifetime)
	}
	return nil
}

// NewIAP verifies assertions for audience (IAP's "/projects/NUMBER/locations/REGION/services/NAME"
// for IAP on a Cloud Run service, as deployed; "/projects/NUMBER/global/backendServices/ID"
// behind a load balancer) against
// the JWK set at url, fetched now and refreshed in the background until ctx ends.
func NewIAP(ctx context.Context, url, audience string) (*IAP, error) {
	if audience == "" {
		return nil, errors.New("console: the IAP audience is empty (IAP_AUDIENCE, --iap-audience)")
	}
	k, err := keyfunc.NewDefaultCtx(ctx, []string{url})
	if err != nil {
		return nil, fmt.Errorf("console: IAP keys from %s: %w", url, err)
	}
	return &IAP{keys: k.Keyfunc, audience: audience, lifetime: lifetimeOfIAP}, nil
}

// NewIAPFromFile verifies assertions for audience against the JWK set in file (the JSON of
// {"keys": [...]}, as Google serves it).
func NewIAPFromFile(file, audience string) (*IAP, error) {
	if audience == "" {
		return nil, errors.New("console: the IAP audience is empty (--iap-audience)")
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("console: IAP keys: %w", err)
	}
	k, err := keyfunc.NewJWKSetJSON(json.RawMessage(raw))
	if err != nil {
		return nil, fmt.Errorf("console: IAP keys in %s: %w", file, err)
	}
	return &IAP{keys: k.Keyfunc, audience: audience, lifetime: lifetimeOfIAP}, nil
}

// Identify returns the verified assertion's email, lower-cased. Errors wrap [ErrNoIdentity]:
// no header, a bad signature, another algorithm, audience or issuer, an expired assertion, one
// without iat or living longer than IAP's (maxLifetime), no email.
func (v *IAP) Identify(r *http.Request) (string, error) {
	raw := r.Header.Get(AssertionHeader)
	if raw == "" {
		return "", fmt.Errorf("%w: no %s header", ErrNoIdentity, AssertionHeader)
	}
	var claims struct {
		jwt.RegisteredClaims
		Email string `json:"email"`
	}
	_, err := jwt.ParseWithClaims(raw, &claims, v.keys,
		jwt.WithValidMethods([]string{jwt.SigningMethodES256.Alg()}),
		jwt.WithAudience(v.audience), jwt.WithIssuer(IAPIssuer),
		jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithLeeway(clockLeeway))
	if err == nil {
		err = v.lifetime(claims.IssuedAt, claims.ExpiresAt)
	}
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrNoIdentity, err)
	}
	if claims.Email == "" {
		return "", fmt.Errorf("%w: the assertion has no email", ErrNoIdentity)
	}
	return strings.ToLower(claims.Email), nil
}

// Operator is one fixed person, for `couponctl console --operator` on loopback: no proxy in
// front, every request is that person's.
type Operator string

// Identify returns the operator's email.
func (o Operator) Identify(*http.Request) (string, error) { return strings.ToLower(string(o)), nil }
