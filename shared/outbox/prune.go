package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/mops/coupon-api/shared/db"
)

// Prune deletes at most batch sent and skipped rows closed more than olderThan ago, oldest
// first, and returns how many it deleted; call it again while it returns batch. Open and parked
// rows are never deleted. `couponctl outbox prune`, the daily operator job, calls it as
// coupon_admin; the relay never does (coupon_relay may not delete, docs/roles.md). Errors: any
// database error (42501 for a role without DELETE on notification_outbox).
func Prune(ctx context.Context, q db.Querier, olderThan time.Duration, batch int) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, sqlOutboxPrune, olderThan, batch).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	return n, nil
}
