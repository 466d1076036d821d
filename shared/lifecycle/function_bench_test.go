package lifecycle

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// BenchmarkServeHTTP is the cost Function.ServeHTTP adds to a request, on every core at once,
// around a handler that does nothing: the built instance read, the request counted in and out,
// its context made cancellable by the drain. "mutex" is what shared/lazy's handler did instead
// on every request (a mutex around the check that the instance is built), kept here only to
// compare with.
//
//	go test -run '^$' -bench ServeHTTP ./shared/lifecycle
func BenchmarkServeHTTP(b *testing.B) {
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	f := NewFunction("Bench", func(context.Context) (*Instance, error) { return &Instance{Handler: noop}, nil }, nil)
	if _, err := f.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	built := true
	mutex := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ok := built
		mu.Unlock()
		if ok {
			noop.ServeHTTP(w, r)
		}
	})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"function", f}, {"mutex", mutex}} {
		b.Run(c.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				req := httptest.NewRequest(http.MethodPost, "/", nil)
				w := httptest.NewRecorder()
				for pb.Next() {
					c.h.ServeHTTP(w, req)
				}
			})
		})
	}
}
