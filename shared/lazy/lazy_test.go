package lazy

import (
	"context"
	"errors"
	"testing"
)

func TestGetBuildsOnceAndRetriesFailures(t *testing.T) {
	calls := 0
	v := New(func(context.Context) (int, error) {
		calls++
		if calls == 1 {
			return 0, errors.New("first build fails")
		}
		return 42, nil
	})
	ctx := context.Background()
	if _, err := v.Get(ctx); err == nil {
		t.Fatal("first Get: want the build error")
	}
	for range 3 {
		if got, err := v.Get(ctx); err != nil || got != 42 {
			t.Fatalf("Get = %d, %v; want 42", got, err)
		}
	}
	if calls != 2 {
		t.Errorf("build called %d times, want 2 (one failure, one success)", calls)
	}
}
