package outboxadmin

import (
	"context"
	"fmt"
	"regexp"

	"github.com/mops/coupon-api/shared/db"
	"github.com/mops/coupon-api/shared/ids"
)

// lineUserIDPattern is the form of a LINE user id: "U" and 32 lowercase hex digits (LINE
// Messaging API reference, "Send push message", property "to"; the same rule is the
// line_user_id_format constraint of member_line_accounts).
var lineUserIDPattern = regexp.MustCompile(`^U[0-9a-f]{32}$`)

// CheckLINEUserID returns an error when id is not a LINE user id ("U" + 32 lowercase hex digits).
func CheckLINEUserID(id string) error {
	if !lineUserIDPattern.MatchString(id) {
		return fmt.Errorf("LINE user id %q: want U followed by 32 lowercase hex digits", id)
	}
	return nil
}

const sqlLink = `
INSERT INTO member_line_accounts (member_id, line_user_id) VALUES ($1, $2)
ON CONFLICT (member_id) DO UPDATE SET line_user_id = EXCLUDED.line_user_id, linked_at = now()
RETURNING 1`

// Link records that memberID's pushes go to the LINE user lineUserID, replacing any earlier
// link of the member. Rows already skipped stay skipped until [Requeue] reopens them. Errors: a
// member id or LINE user id out of format, or any database error.
func Link(ctx context.Context, q db.Querier, memberID, lineUserID string) error {
	if err := ids.Member(memberID); err != nil {
		return err
	}
	if err := CheckLINEUserID(lineUserID); err != nil {
		return err
	}
	var one int
	if err := q.QueryRow(ctx, sqlLink, memberID, lineUserID).Scan(&one); err != nil {
		return fmt.Errorf("outboxadmin: link %s: %w", memberID, err)
	}
	return nil
}

const sqlUnlink = `
WITH d AS (DELETE FROM member_line_accounts WHERE member_id = $1 RETURNING 1)
SELECT count(*) > 0 FROM d`

// Unlink removes memberID's LINE account, so its coupons not yet pushed are skipped. It reports
// whether the member had one. Errors: any database error.
func Unlink(ctx context.Context, q db.Querier, memberID string) (bool, error) {
	var had bool
	if err := q.QueryRow(ctx, sqlUnlink, memberID).Scan(&had); err != nil {
		return false, fmt.Errorf("outboxadmin: unlink %s: %w", memberID, err)
	}
	return had, nil
}
