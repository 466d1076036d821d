package gcpfake

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	metricpb "go.opentelemetry.io/proto/otlp/metrics/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	_ "google.golang.org/grpc/encoding/gzip" // OTEL_EXPORTER_OTLP_COMPRESSION=gzip, as deployed
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// TelemetryAPI is Google's Telemetry (OTLP) API over gRPC with TLS, as the deployed functions
// reach it. It accepts a request only when
//
//   - it carries "authorization: Bearer TOKEN" with a live token of the metadata server's
//     (Telemetry API overview, "Authentication"); otherwise Unauthenticated, as Google answers;
//   - every resource names the project in gcp.project_id, the attribute Google's examples of
//     in-process export set (OTEL_RESOURCE_ATTRIBUTES=gcp.project_id=...); otherwise
//     InvalidArgument;
//   - for metrics, every resource has a location (location, cloud.availability_zone or
//     cloud.region: required by the v1.metrics reference, "Prometheus mapping"), and every
//     metric name and data point attribute key passes [CheckMetricName] and [CheckLabelKey]
//     (the same page's naming rules); otherwise InvalidArgument;
//   - for metrics, every resource has service.instance.id. This one is the project's rule, not
//     Google's: Google falls back to other attributes for the instance label, but only a value
//     of its own per instance keeps two Cloud Run instances' cumulative series apart.
//
// It keeps what it accepted and why it refused the rest.
type TelemetryAPI struct {
	// Endpoint is the URL to put in OTEL_EXPORTER_OTLP_ENDPOINT (https://127.0.0.1:PORT).
	Endpoint string
	// CertFile is the server certificate (PEM), to put in OTEL_EXPORTER_OTLP_CERTIFICATE.
	CertFile string

	validToken func(string) bool
	project    string
	mu         sync.Mutex
	tokens     map[string]bool // the tokens of the accepted requests
	spans      []*tracepb.ResourceSpans
	metrics    []*metricpb.ResourceMetrics
	refused    []string
}

// StartTelemetryAPI serves until the test ends, for project, accepting the tokens validToken
// accepts (a [Metadata]'s Valid).
func StartTelemetryAPI(t testing.TB, project string, validToken func(string) bool) *TelemetryAPI {
	t.Helper()
	cert, certFile := selfSigned(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	api := &TelemetryAPI{Endpoint: "https://" + lis.Addr().String(), CertFile: certFile, validToken: validToken, project: project,
		tokens: map[string]bool{}}
	srv := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&cert)))
	coltracepb.RegisterTraceServiceServer(srv, traceService{api: api})
	colmetricpb.RegisterMetricsServiceServer(srv, metricsService{api: api})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return api
}

// Spans returns the resource spans accepted so far.
func (a *TelemetryAPI) Spans() []*tracepb.ResourceSpans {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*tracepb.ResourceSpans(nil), a.spans...)
}

// Metrics returns the resource metrics accepted so far.
func (a *TelemetryAPI) Metrics() []*metricpb.ResourceMetrics {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]*metricpb.ResourceMetrics(nil), a.metrics...)
}

// CheckAllTaken fails the test if the API refused a request, or if log (the output of the process
// that exported) reports a failed export.
func (a *TelemetryAPI) CheckAllTaken(t testing.TB, log string) {
	t.Helper()
	if r := a.Refused(); len(r) > 0 {
		t.Errorf("the Telemetry API refused %d requests: %q", len(r), r)
	}
	if strings.Contains(log, "export failed") {
		t.Errorf("the process logged a failed export:\n%s", log)
	}
}

// AllSpans returns every span accepted so far, whatever its resource and scope.
func (a *TelemetryAPI) AllSpans() []*tracepb.Span {
	var out []*tracepb.Span
	for _, rs := range a.Spans() {
		for _, ss := range rs.GetScopeSpans() {
			out = append(out, ss.GetSpans()...)
		}
	}
	return out
}

// MetricNames returns the name of every metric accepted so far, once per export.
func (a *TelemetryAPI) MetricNames() []string {
	var out []string
	for _, rm := range a.Metrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				out = append(out, m.GetName())
			}
		}
	}
	return out
}

// AcceptedTokens is the number of different access tokens the accepted requests carried.
func (a *TelemetryAPI) AcceptedTokens() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.tokens)
}

// Refused returns why each refused request was refused, in order.
func (a *TelemetryAPI) Refused() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.refused...)
}

// admit checks the credentials and every resource; a refusal is recorded and returned as the
// gRPC status the client sees.
func (a *TelemetryAPI) admit(ctx context.Context, signal string, resources []*resourcepb.Resource, check func() error) error {
	err := a.check(ctx, resources, check)
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil {
		a.refused = append(a.refused, signal+": "+err.Error())
	} else {
		md, _ := metadata.FromIncomingContext(ctx)
		a.tokens[md.Get("authorization")[0]] = true
	}
	return err
}

func (a *TelemetryAPI) check(ctx context.Context, resources []*resourcepb.Resource, check func() error) error {
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get("authorization")
	if len(got) != 1 || !strings.HasPrefix(got[0], "Bearer ") || !a.validToken(strings.TrimPrefix(got[0], "Bearer ")) {
		return status.Error(codes.Unauthenticated, "request is missing a valid Google access token")
	}
	for _, r := range resources {
		if p := attr(r.GetAttributes(), "gcp.project_id"); p != a.project {
			return status.Errorf(codes.InvalidArgument, "resource gcp.project_id is %q, want %q", p, a.project)
		}
	}
	if check != nil {
		if err := check(); err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
	}
	return nil
}

type traceService struct {
	coltracepb.UnimplementedTraceServiceServer
	api *TelemetryAPI
}

func (s traceService) Export(ctx context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	if err := s.api.admit(ctx, "traces", resources(req.GetResourceSpans()), nil); err != nil {
		return nil, err
	}
	s.api.mu.Lock()
	defer s.api.mu.Unlock()
	s.api.spans = append(s.api.spans, req.GetResourceSpans()...)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	api *TelemetryAPI
}

func (s metricsService) Export(ctx context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	if err := s.api.admit(ctx, "metrics", resources(req.GetResourceMetrics()), func() error { return checkMetrics(req) }); err != nil {
		return nil, err
	}
	s.api.mu.Lock()
	defer s.api.mu.Unlock()
	s.api.metrics = append(s.api.metrics, req.GetResourceMetrics()...)
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

// resources returns the resource of each item of a request.
func resources[T interface{ GetResource() *resourcepb.Resource }](items []T) []*resourcepb.Resource {
	out := make([]*resourcepb.Resource, 0, len(items))
	for _, it := range items {
		out = append(out, it.GetResource())
	}
	return out
}

// checkMetrics applies the metric rules to every resource and metric of req.
func checkMetrics(req *colmetricpb.ExportMetricsServiceRequest) error {
	for _, rm := range req.GetResourceMetrics() {
		if err := prometheusTarget(rm.GetResource()); err != nil {
			return err
		}
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				if err := checkMetric(m); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// prometheusTarget checks that r gives the location and instance labels.
func prometheusTarget(r *resourcepb.Resource) error {
	kv := r.GetAttributes()
	if attr(kv, "location") == "" && attr(kv, "cloud.availability_zone") == "" && attr(kv, "cloud.region") == "" {
		return fmt.Errorf("resource has no location (location, cloud.availability_zone or cloud.region)")
	}
	if attr(kv, "service.instance.id") == "" {
		return fmt.Errorf("resource has no service.instance.id: the instance label would be empty")
	}
	return nil
}

// checkMetric checks m's name and the attribute keys of all its data points.
func checkMetric(m *metricpb.Metric) error {
	if err := CheckMetricName(m.GetName()); err != nil {
		return err
	}
	var keys [][]*commonpb.KeyValue
	switch d := m.GetData().(type) {
	case *metricpb.Metric_Sum:
		for _, p := range d.Sum.GetDataPoints() {
			keys = append(keys, p.GetAttributes())
		}
	case *metricpb.Metric_Gauge:
		for _, p := range d.Gauge.GetDataPoints() {
			keys = append(keys, p.GetAttributes())
		}
	case *metricpb.Metric_Histogram:
		for _, p := range d.Histogram.GetDataPoints() {
			keys = append(keys, p.GetAttributes())
		}
	case *metricpb.Metric_ExponentialHistogram:
		for _, p := range d.ExponentialHistogram.GetDataPoints() {
			keys = append(keys, p.GetAttributes())
		}
	}
	for _, kvs := range keys {
		for _, kv := range kvs {
			if err := CheckLabelKey(kv.GetKey()); err != nil {
				return fmt.Errorf("metric %s: %w", m.GetName(), err)
			}
		}
	}
	return nil
}

// attr returns the string value of key in kvs, or "".
func attr(kvs []*commonpb.KeyValue, key string) string {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// selfSigned makes a certificate for 127.0.0.1 and writes it (PEM) under the test's temporary
// directory.
func selfSigned(t testing.TB) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "telemetry.googleapis.com stand-in"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "telemetry-api.pem")
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, file
}
