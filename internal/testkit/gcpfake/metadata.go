package gcpfake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Metadata is a Cloud Run instance's metadata server: it answers the paths the GCP resource
// detector and Application Default Credentials read (Compute Engine docs, "About VM metadata";
// Cloud Run docs, "Container runtime contract: metadata server"), and only requests carrying
// the Metadata-Flavor: Google header, as the real server does. Each token request gets a new
// access token, valid for the configured lifetime.
type Metadata struct {
	// Host is the host:port to put in GCE_METADATA_HOST.
	Host string

	mu     sync.Mutex
	expiry map[string]time.Time // access token -> end of its life
}

// MetadataConfig is what the fake instance reports.
type MetadataConfig struct {
	Project, Region, InstanceID string
	// TokenLifetime is each access token's life (expires_in); 0 means an hour, as Google's.
	TokenLifetime time.Duration
}

// StartMetadata serves cfg until the test ends.
func StartMetadata(t testing.TB, cfg MetadataConfig) *Metadata {
	t.Helper()
	if cfg.TokenLifetime == 0 {
		cfg.TokenLifetime = time.Hour
	}
	m := &Metadata{expiry: map[string]time.Time{}}
	values := map[string]string{
		"/computeMetadata/v1/project/project-id":                      cfg.Project,
		"/computeMetadata/v1/project/numeric-project-id":              "123456789012",
		"/computeMetadata/v1/instance/region":                         "projects/123456789012/regions/" + cfg.Region,
		"/computeMetadata/v1/instance/id":                             cfg.InstanceID,
		"/computeMetadata/v1/instance/service-accounts/default/email": cfg.Project + "-sa@" + cfg.Project + ".iam.gserviceaccount.com",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Metadata-Flavor") != "Google" {
			http.Error(w, "missing Metadata-Flavor: Google", http.StatusForbidden)
			return
		}
		w.Header().Set("Metadata-Flavor", "Google")
		if strings.HasPrefix(r.URL.Path, "/computeMetadata/v1/instance/service-accounts/default/token") {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"access_token": m.issue(cfg.TokenLifetime), "expires_in": int(cfg.TokenLifetime.Seconds()), "token_type": "Bearer"})
			return
		}
		v, ok := values[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(v))
	}))
	t.Cleanup(srv.Close)
	m.Host = strings.TrimPrefix(srv.URL, "http://")
	return m
}

// issue makes a new access token that lives for life.
func (m *Metadata) issue(life time.Duration) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	token := fmt.Sprintf("ya29.stand-in-%d", len(m.expiry)+1)
	m.expiry[token] = time.Now().Add(life)
	return token
}

// Valid reports whether token is one this server handed out and still alive.
func (m *Metadata) Valid(token string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	end, ok := m.expiry[token]
	return ok && time.Now().Before(end)
}

// Tokens is the number of access tokens handed out.
func (m *Metadata) Tokens() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.expiry)
}
