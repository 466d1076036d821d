package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/mops/coupon-api/shared/db"
)

// Prune deletes at most batch sent and skipped rows closed more than olderThan ago, oldest
// first, and returns how many it deleted; call it again while it returns batch. Open and parked
// rows are never deleted. Errors: any database error.
func Prune(ctx context.Context, q db.Querier, olderThan time.Duration, batch int) (int64, error) {
	var n int64
	if err := q.QueryRow(ctx, sqlOutboxPrune, olderThan, batch).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	return n, nil
}
