package hotbench

import (
	"context"
	"sync"
	"testing"
	"time"
)

// countingFleet answers ISSUED and counts the requests each instance got.
type countingFleet struct {
	mu  sync.Mutex
	got map[int]int
}

func (f *countingFleet) Issue(_ context.Context, i int, _, _ string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.got[i]++
	return "ISSUED", nil
}
func (f *countingFleet) CPU() (time.Duration, error) { return 0, nil }
func (f *countingFleet) Close() error                { return nil }

// TestSpreadLoopRoundRobin: the clients' requests go to every instance in turn, as Cloud Run's
// load balancer spreads them: no instance gets more than one request more than another.
func TestSpreadLoopRoundRobin(t *testing.T) {
	f := &countingFleet{got: map[int]int{}}
	shape := Shape{Instances: 5, Clients: 3}
	lat, failed, _, err := spreadLoop(context.Background(), f, shape, 50*time.Millisecond, []string{"C"})
	if err != nil || failed != 0 {
		t.Fatalf("err %v, failed %d", err, failed)
	}
	if len(f.got) != shape.Instances {
		t.Fatalf("instances reached %v, want all %d", f.got, shape.Instances)
	}
	lo, hi, sum := len(lat), 0, 0
	for _, n := range f.got {
		lo, hi, sum = min(lo, n), max(hi, n), sum+n
	}
	if sum != len(lat) || hi-lo > 1 {
		t.Errorf("requests per instance %v (%d answered): want an even spread", f.got, len(lat))
	}
}
