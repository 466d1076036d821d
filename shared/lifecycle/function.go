package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mops/coupon-api/shared/reqbody"
)

// Instance is what a function's constructor builds once per instance.
type Instance struct {
	// Handler serves every request, instrumented.
	Handler http.Handler
	// Settings are the effective settings as key-value pairs, for the start-up log line.
	Settings []any
	// Closers run in order after the drain (the pool's close); see [Server.Closers].
	Closers []Closer
}

// Function is one function as the functions framework serves it: its package registers
// [Function.ServeHTTP] with functions.HTTP in init, and whatever serves it ([Serve]) starts it
// first. It is safe for concurrent use.
type Function struct {
	name   string
	open   func(context.Context) (*Instance, error)
	refuse func(w http.ResponseWriter, status int)

	mu   sync.Mutex // guards next; never held across a build
	next *build     // the build under way, or the last one done; nil before the first

	live atomic.Pointer[run] // what serves requests; nil until a build succeeds
}

// NewFunction returns the function called name, built by open (its constructor: its settings,
// then [OpenDB], then its handler) and refusing, in its own body, what it cannot serve with
// refuse: 503 while it shuts down, 500 when a build started by a request fails.
func NewFunction(name string, open func(context.Context) (*Instance, error), refuse func(w http.ResponseWriter, status int)) *Function {
	return &Function{name: name, open: open, refuse: refuse}
}

// Name is the function's name: its registration with the framework, and FUNCTION_TARGET.
func (f *Function) Name() string { return f.name }

// Start builds the function with its constructor if no earlier build succeeded, and waits for
// the build, or for a build already under way, at most until ctx ends. The build gets ctx's
// values without its cancellation, so that a caller who gives up leaves it to the others; the
// constructor bounds it ([OpenDB]'s check is bounded by schema.CheckTimeout). A failed build
// is tried again by the next call. After [Serve] has shut the function down, Start builds it
// anew.
func (f *Function) Start(ctx context.Context) (*Instance, error) {
	if r := f.live.Load(); r != nil && r.draining.Load() {
		f.mu.Lock()
		f.live.CompareAndSwap(r, nil)
		f.next = nil
		f.mu.Unlock()
	}
	r, err := f.start(ctx)
	if err != nil {
		return nil, err
	}
	return r.inst, nil
}

// build is one run of the constructor; done is closed once run or err is set.
type build struct {
	done chan struct{}
	run  *run
	err  error
}

func (b *build) failed() bool {
	select {
	case <-b.done:
		return b.err != nil
	default:
		return false
	}
}

func (f *Function) start(ctx context.Context) (*run, error) {
	f.mu.Lock()
	b := f.next
	if b == nil || b.failed() {
		b = &build{done: make(chan struct{})}
		f.next = b
		go f.build(context.WithoutCancel(ctx), b)
	}
	f.mu.Unlock()
	select {
	case <-b.done:
		return b.run, b.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: waiting for its start: %w", f.name, ctx.Err())
	}
}

func (f *Function) build(ctx context.Context, b *build) {
	defer close(b.done)
	inst, err := f.open(ctx)
	if err != nil {
		b.err = fmt.Errorf("%s: %w", f.name, err)
		return
	}
	stop, cancel := context.WithCancel(context.Background())
	b.run = &run{inst: inst, stop: stop, cancelAll: cancel, idle: make(chan struct{}, 1)}
	f.live.Store(b.run)
}

// ServeHTTP serves one request with the function's handler, counted until it returns. Before
// any build it starts the function itself (see [Function.Start]), as a function that the
// framework alone serves does; once [Serve] shuts the function down it refuses new requests
// (503). A request still running when the drain's bound is reached sees its context cancelled.
func (f *Function) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rn := f.live.Load()
	if rn == nil {
		var err error
		if rn, err = f.start(r.Context()); err != nil {
			if r.Context().Err() == nil {
				slog.ErrorContext(r.Context(), f.name+": start-up", "err", err)
			}
			reqbody.SkipBody(w, r)
			f.refuse(w, http.StatusInternalServerError)
			return
		}
	}
	if !rn.enter() {
		w.Header().Set("Connection", "close")
		f.refuse(w, http.StatusServiceUnavailable)
		_ = http.NewResponseController(w).Flush()
		return
	}
	defer rn.leave()
	defer f.recoverPanic(w, r)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(rn.stop, cancel)()
	rn.inst.Handler.ServeHTTP(w, r.WithContext(ctx))
	// The answer goes on the wire before the request is counted out: once the drain finds no
	// request in flight, the process may exit at once, before the server would flush it.
	_ = http.NewResponseController(w).Flush()
}

// recoverPanic answers a request whose handler panicked 500, by refuse, and logs the panic with
// its stack, as the functions framework's own server does (its recoverPanic): net/http would
// only log it and drop the connection, leaving the caller no answer. http.ErrAbortHandler, a
// handler's deliberate abort, goes on to net/http.
func (f *Function) recoverPanic(w http.ResponseWriter, r *http.Request) {
	p := recover()
	if p == nil {
		return
	}
	if p == http.ErrAbortHandler {
		panic(p)
	}
	slog.ErrorContext(r.Context(), f.name+": panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	w.Header().Set("Connection", "close")
	f.refuse(w, http.StatusInternalServerError)
	_ = http.NewResponseController(w).Flush() // before the request is counted out, as ServeHTTP's
}

// InFlight is how many requests the function is serving now.
func (f *Function) InFlight() int64 {
	if r := f.live.Load(); r != nil {
		return r.inflight.Load()
	}
	return 0
}

// run is one built instance of a function, and its requests in flight.
type run struct {
	inst      *Instance
	stop      context.Context // done once the drain's bound is reached
	cancelAll context.CancelFunc

	inflight atomic.Int64
	draining atomic.Bool
	idle     chan struct{} // signalled when the last request in flight leaves during a drain
}

// enter counts a request in, unless the run drains.
func (r *run) enter() bool {
	r.inflight.Add(1)
	if r.draining.Load() {
		r.leave()
		return false
	}
	return true
}

func (r *run) leave() {
	if r.inflight.Add(-1) == 0 && r.draining.Load() {
		select {
		case r.idle <- struct{}{}:
		default:
		}
	}
}

// wait waits until no request is in flight, or ctx ends; it reports whether none is.
func (r *run) wait(ctx context.Context) bool {
	for r.inflight.Load() > 0 {
		select {
		case <-r.idle:
		case <-ctx.Done():
			return r.inflight.Load() == 0
		}
	}
	return true
}

// WriteJSON answers v as JSON with status and its Content-Length, so that the answer is whole
// on the wire once [Function.ServeHTTP] has flushed it (with no length, the server would still
// owe the answer's last chunk after the flush). Errors: the encoding's or the write's.
func WriteJSON(w http.ResponseWriter, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		w.WriteHeader(http.StatusInternalServerError)
		return err
	}
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, err = w.Write(b)
	return err
}
