// Package bodywait is a broken variant kept as a fixture (issue 29): a function whose answers
// decided by the headers wait for the request's body, as before reqbody.SkipBody.
package bodywait

import (
	"context"
	"net/http"

	"github.com/mops/coupon-api/shared/lifecycle"
)

// Function is the broken variant of the answers decided by the headers (405, 415, 413 by
// Content-Length), kept as a fixture: the function called name, built by open, whose handler
// answers as before 333c614, without reqbody.SkipBody. net/http then reads the announced body
// before it writes the answer, so a client that stalls before its body gets no answer, and its
// request, in flight, holds the drain (issue 29). Its refusals by lifecycle (503 in the drain,
// 500 when a start fails) are the status alone.
func Function(name string, open func(context.Context) (*lifecycle.Instance, error)) *lifecycle.Function {
	return lifecycle.NewFunction(name, func(ctx context.Context) (*lifecycle.Instance, error) {
		inst, err := open(ctx)
		if err != nil {
			return nil, err
		}
		h := inst.Handler
		inst.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h.ServeHTTP(&skipBodyUndone{ResponseWriter: w}, r)
		})
		return inst, nil
	}, func(w http.ResponseWriter, status int) { w.WriteHeader(status) })
}

// skipBodyUndone undoes what reqbody.SkipBody does to an answer: it drops the Connection: close
// header as the answer's header is written, and offers no read deadline to set
// (http.ResponseController answers ErrNotSupported, which SkipBody ignores).
type skipBodyUndone struct {
	http.ResponseWriter
	wrote bool
}

func (w *skipBodyUndone) WriteHeader(status int) {
	if !w.wrote {
		w.wrote = true
		w.ResponseWriter.Header().Del("Connection")
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *skipBodyUndone) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}
