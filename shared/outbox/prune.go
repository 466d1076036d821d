package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/outbox/outboxdb"
)

// Prune deletes at most batch sent and skipped rows closed more than olderThan ago, oldest
// first, and returns how many it deleted; call it again while it returns batch. Open and parked
// rows are never deleted. Prune is the only code that deletes outbox rows: `couponops outbox
// prune`, the daily Cloud Run job (or `couponctl outbox prune` by hand), runs it as
// coupon_admin, and coupon_relay has no DELETE on the table (docs/roles.md), so a relay run
// cannot. Errors: any database error (42501 for a role without DELETE on notification_outbox).
func Prune(ctx context.Context, q db.Querier, olderThan time.Duration, batch int) (int64, error) {
	n, err := outboxdb.Prune(ctx, q, olderThan, batch)
	if err != nil {
		return 0, fmt.Errorf("outbox: prune: %w", err)
	}
	return n, nil
}
