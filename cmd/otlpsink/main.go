// Command otlpsink is a local OTLP/HTTP receiver for measuring telemetry's cost: it accepts
// /v1/traces and /v1/metrics (http/protobuf), counts spans and metric points, and on Ctrl-C
// prints the counts and one exported trace from the tap to the LINE push (an ISSUED
// issuance's spans and the push span that links to it). It stores nothing else.
//
//	go run ./cmd/otlpsink -addr 127.0.0.1:4318 &
//	OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
//	OTEL_TRACES_EXPORTER=otlp OTEL_METRICS_EXPORTER=otlp go run ./cmd/couponctl demo
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"sync"

	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// span is what the sink keeps of a span.
type span struct {
	name, trace, id, parent, result string
	links                           []string // "trace/span"
}

type sink struct {
	mu                    sync.Mutex
	spans                 []span
	traceReqs, metricReqs int
	points                int
	bytes                 int64
	decode                bool
}

func main() {
	addr := flag.String("addr", "127.0.0.1:4318", "listen address")
	decode := flag.Bool("decode", true, "decode the requests (false: only count bytes, so the sink costs the measured process's machine almost nothing)")
	flag.Parse()
	s := &sink{decode: *decode}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", s.traces)
	mux.HandleFunc("POST /v1/metrics", s.metrics)
	srv := &http.Server{Addr: *addr, Handler: mux}
	go func() {
		if err := srv.ListenAndServe(); err != http.ErrServerClosed {
			log.Fatal(err)
		}
	}()
	fmt.Fprintf(os.Stderr, "otlpsink: listening on %s (Ctrl-C prints the summary)\n", *addr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	<-ctx.Done()
	_ = srv.Shutdown(context.Background())
	s.summary(os.Stdout)
}

func (s *sink) read(w http.ResponseWriter, r *http.Request, m proto.Message) bool {
	b, err := io.ReadAll(r.Body)
	if err == nil && s.decode {
		err = proto.Unmarshal(b, m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	s.mu.Lock()
	s.bytes += int64(len(b))
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	return true
}

func (s *sink) traces(w http.ResponseWriter, r *http.Request) {
	var req coltracepb.ExportTraceServiceRequest
	if !s.read(w, r, &req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.traceReqs++
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				s.spans = append(s.spans, keep(sp))
			}
		}
	}
}

func keep(sp *tracepb.Span) span {
	k := span{name: sp.Name, trace: hex.EncodeToString(sp.TraceId), id: hex.EncodeToString(sp.SpanId),
		parent: hex.EncodeToString(sp.ParentSpanId)}
	for _, a := range sp.Attributes {
		if a.Key == "coupon.result" {
			k.result = a.Value.GetStringValue()
		}
	}
	for _, l := range sp.Links {
		k.links = append(k.links, hex.EncodeToString(l.TraceId)+"/"+hex.EncodeToString(l.SpanId))
	}
	return k
}

func (s *sink) metrics(w http.ResponseWriter, r *http.Request) {
	var req colmetricpb.ExportMetricsServiceRequest
	if !s.read(w, r, &req) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.metricReqs++
	for _, rm := range req.ResourceMetrics {
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				s.points += len(m.GetSum().GetDataPoints()) + len(m.GetGauge().GetDataPoints()) +
					len(m.GetHistogram().GetDataPoints())
			}
		}
	}
}

// summary prints the counts and one ISSUED issuance's trace with the push linked to it.
func (s *sink) summary(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(w, "otlpsink: %d trace requests (%d spans), %d metric requests (%d points), %d bytes\n",
		s.traceReqs, len(s.spans), s.metricReqs, s.points, s.bytes)
	for _, is := range s.spans {
		if is.name != "issuance.Issue" || is.result != "ISSUED" {
			continue
		}
		push := s.linkedTo(is)
		if push == nil {
			continue
		}
		fmt.Fprintf(w, "one exported trace %s:\n", is.trace)
		for _, sp := range s.spans {
			if sp.trace == is.trace {
				fmt.Fprintf(w, "  span %s %-28s parent %s\n", sp.id, sp.name, sp.parent)
			}
		}
		fmt.Fprintf(w, "its push, in the relay run's trace %s:\n", push.trace)
		for _, sp := range s.spans {
			if sp.trace == push.trace && (sp.id == push.id || sp.id == push.parent || sp.parent == push.id) {
				fmt.Fprintf(w, "  span %s %-28s parent %s links %v\n", sp.id, sp.name, sp.parent, sp.links)
			}
		}
		return
	}
}

// linkedTo is the last span that links to to (its push, for an issuance), or nil.
func (s *sink) linkedTo(to span) *span {
	var found *span
	for i, p := range s.spans {
		for _, l := range p.links {
			if l == to.trace+"/"+to.id {
				found = &s.spans[i]
			}
		}
	}
	return found
}
