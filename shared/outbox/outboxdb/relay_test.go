package outboxdb

import (
	"context"
	"testing"

	"github.com/google/uuid"
)

// TestMarkParkedRefusesAnUnknownCharge: a charge other than NotPushed and Pushed is refused
// before any SQL runs (the nil Execer would panic).
func TestMarkParkedRefusesAnUnknownCharge(t *testing.T) {
	if err := MarkParked(context.Background(), nil, uuid.New(), "c", "r", Charge(2)); err == nil {
		t.Error("Charge(2): accepted, want refused")
	}
}
