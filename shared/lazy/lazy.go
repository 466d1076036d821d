// Package lazy holds per-instance state that the first request builds, such as a function's
// handler and pool when the functions framework serves it: made once per instance, never per
// request (golang-samples: the pool and the connector).
package lazy

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
)

// Value is a T built on first use by its build function. It is safe for concurrent use.
type Value[T any] struct {
	build func(context.Context) (T, error)
	mu    sync.Mutex
	v     T
	built bool
}

// New returns a Value that build makes on first use. build receives the first caller's
// context without its cancellation: what it builds outlives that request.
func New[T any](build func(context.Context) (T, error)) *Value[T] {
	return &Value[T]{build: build}
}

// Get returns the value, building it first if no earlier call did so successfully. Callers
// wait for a build under way. Errors: build's, and the next call builds again.
func (l *Value[T]) Get(ctx context.Context) (T, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.built {
		return l.v, nil
	}
	v, err := l.build(context.WithoutCancel(ctx))
	if err != nil {
		return v, err
	}
	l.v, l.built = v, true
	return v, nil
}

// Handler serves each request with the http.Handler that v builds on first use; while it
// cannot be built, it logs the failure as name's start-up error and answers with fail.
func Handler[T http.Handler](v *Value[T], name string, fail http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, err := v.Get(r.Context())
		if err != nil {
			slog.Error(name+": start-up", "err", err)
			fail(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
