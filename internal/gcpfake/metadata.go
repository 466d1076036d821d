package gcpfake

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// Metadata is a Cloud Run instance's metadata server: it answers the paths the GCP resource
// detector and Application Default Credentials read (Compute Engine docs, "About VM metadata";
// Cloud Run docs, "Container runtime contract: metadata server"), and only requests carrying
// the Metadata-Flavor: Google header, as the real server does.
type Metadata struct {
	// Host is the host:port to put in GCE_METADATA_HOST.
	Host string
	// Tokens counts the access tokens handed out.
	Tokens atomic.Int64
}

// MetadataConfig is what the fake instance reports.
type MetadataConfig struct {
	Project, Region, InstanceID, Token string
}

// StartMetadata serves cfg until the test ends.
func StartMetadata(t testing.TB, cfg MetadataConfig) *Metadata {
	t.Helper()
	m := &Metadata{}
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
			m.Tokens.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]any{
				"access_token": cfg.Token, "expires_in": 3599, "token_type": "Bearer"})
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
