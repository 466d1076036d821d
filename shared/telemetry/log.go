package telemetry

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"io"
	"log/slog"
	"os"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// The fields of Cloud Logging's structured JSON that join a log line to its trace (Cloud
// Logging docs, "Structured logging": special JSON fields).
const (
	LogKeyTrace   = "logging.googleapis.com/trace"
	LogKeySpanID  = "logging.googleapis.com/spanId"
	LogKeySampled = "logging.googleapis.com/trace_sampled"
)

// NewLogger returns a logger writing one JSON object per line to w in Cloud Logging's
// structured shape: "severity" (DEBUG, INFO, WARNING, ERROR), "message", "time", and, when the
// context passed to a *Context method holds a span, "logging.googleapis.com/trace" =
// projects/<project>/traces/<trace id> (the bare trace id when project is ""),
// "logging.googleapis.com/spanId" and "logging.googleapis.com/trace_sampled".
func NewLogger(w io.Writer, project string) *slog.Logger {
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{ReplaceAttr: cloudLoggingAttr})
	prefix := ""
	if project != "" {
		prefix = "projects/" + project + "/traces/"
	}
	return slog.New(traceHandler{Handler: h, tracePrefix: prefix})
}

// cloudLoggingAttr renames slog's top-level level and msg to Cloud Logging's severity and
// message.
func cloudLoggingAttr(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.LevelKey:
		level, _ := a.Value.Any().(slog.Level)
		return slog.String("severity", severity(level))
	case slog.MessageKey:
		a.Key = "message"
	}
	return a
}

// severity maps a slog level to Cloud Logging's LogSeverity names.
func severity(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	default:
		return "DEBUG"
	}
}

// traceHandler adds the trace fields of the context's span to each record.
type traceHandler struct {
	slog.Handler
	tracePrefix string // "projects/<project>/traces/", or "" without a project
}

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		tid, sid := sc.TraceID(), sc.SpanID()
		var tr [128]byte
		var span [2 * len(sid)]byte
		hex.Encode(span[:], sid[:])
		r.AddAttrs(slog.String(LogKeyTrace, string(hex.AppendEncode(append(tr[:0], h.tracePrefix...), tid[:]))),
			slog.String(LogKeySpanID, string(span[:])), slog.Bool(LogKeySampled, sc.IsSampled()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{Handler: h.Handler.WithAttrs(as), tracePrefix: h.tracePrefix}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{Handler: h.Handler.WithGroup(name), tracePrefix: h.tracePrefix}
}

// MemberKeyEnv names the environment variable holding the key of [MemberHash] (any string;
// mount it from Secret Manager, the same for every instance and function so hashes join).
const MemberKeyEnv = "TELEMETRY_MEMBER_KEY"

// memberMACs holds *memberMAC: HMAC-SHA256 states keyed with the member key, whose Reset puts
// them back to just after the key, so that a hash costs the member id's blocks only.
var memberMACs = sync.Pool{New: func() any { return &memberMAC{mac: hmac.New(sha256.New, memberKey())} }}

// memberMAC is one keyed state, with room for the id and the sum, so that hashing allocates
// nothing but the result.
type memberMAC struct {
	mac hash.Hash
	in  []byte
	sum [sha256.Size]byte
}

var memberKey = sync.OnceValue(func() []byte {
	if k := os.Getenv(MemberKeyEnv); k != "" {
		return []byte(k)
	}
	// No key: a random one per process. Hashes still join within an instance and can never be
	// reversed by a dictionary of member ids, but do not join across instances.
	k := make([]byte, 32)
	_, _ = rand.Read(k) // crypto/rand.Read never fails (Go 1.24+)
	return k
})

// MemberHash returns a keyed hash of a member id for logs and spans: HMAC-SHA256 under
// TELEMETRY_MEMBER_KEY, the first 16 bytes in hex. It joins a member's lines without ever
// writing the id in clear (docs/api.md, "Telemetry"); whoever holds the key can compute the
// hash of a given member to find their lines.
func MemberHash(memberID string) string {
	m := memberMACs.Get().(*memberMAC)
	defer memberMACs.Put(m)
	m.mac.Reset()
	m.in = append(m.in[:0], memberID...)
	m.mac.Write(m.in)
	var out [32]byte
	hex.Encode(out[:], m.mac.Sum(m.sum[:0])[:16])
	return string(out[:])
}
