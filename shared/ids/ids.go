// Package ids holds the formats of the identifiers callers send (docs/api.md, "IssueCoupon" and
// "RedeemCoupon"): the request decoders, the issuance service, campaign creation and couponctl
// check ids here, and the schema states the same formats as CHECK constraints (member_id_format,
// campaign_id_format, order_id_format) and argument checks (redemption_args_check).
package ids

import (
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// Lengths in bytes.
const (
	MaxMemberIDLen   = 128 // member_id: 1-128 bytes of visible ASCII (0x21-0x7E)
	MaxCampaignIDLen = 64  // campaign_id: 1-64 bytes of [A-Za-z0-9_-]
	MaxOrderIDLen    = 128 // order_id: 1-128 bytes of visible ASCII (0x21-0x7E)
)

// ErrInvalid is wrapped by every error of this package: an id that breaks its format.
var ErrInvalid = errors.New("invalid id")

// Member returns a wrapped [ErrInvalid] when id is not 1-128 bytes of visible ASCII.
func Member(id string) error { return visibleASCII("member_id", id, MaxMemberIDLen) }

// Order returns a wrapped [ErrInvalid] when id, the cart's or the POS's order id, is not 1-128
// bytes of visible ASCII.
func Order(id string) error { return visibleASCII("order_id", id, MaxOrderIDLen) }

// visibleASCII returns a wrapped [ErrInvalid], naming field, when id is not 1-maxLen bytes of
// visible ASCII (0x21-0x7E).
func visibleASCII(field, id string, maxLen int) error {
	if n := len(id); n < 1 || n > maxLen {
		return fmt.Errorf("%w: %s must be 1-%d bytes, got %d", ErrInvalid, field, maxLen, n)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: %s must be visible ASCII (0x21-0x7E), byte %d is 0x%02X", ErrInvalid, field, i, c)
		}
	}
	return nil
}

// Campaign returns a wrapped [ErrInvalid] when id is not 1-64 bytes of [A-Za-z0-9_-].
func Campaign(id string) error {
	if n := len(id); n < 1 || n > MaxCampaignIDLen {
		return fmt.Errorf("%w: campaign_id must be 1-%d bytes, got %d", ErrInvalid, MaxCampaignIDLen, n)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: campaign_id must be [A-Za-z0-9_-], byte %d is 0x%02X", ErrInvalid, i, c)
		}
	}
	return nil
}

// Request checks both ids of an issuance request, member first, and returns the first error.
func Request(memberID, campaignID string) error {
	if err := Member(memberID); err != nil {
		return err
	}
	return Campaign(campaignID)
}

// CouponIDLen is the length of a coupon id as the services answer it: a UUID in its canonical
// 36-character form (8-4-4-4-12 hexadecimal digits).
const CouponIDLen = 36

// Coupon parses id, a coupon id as IssueCoupon answered it, and returns a wrapped [ErrInvalid]
// when it is not a UUID in its canonical 36-character form (upper- or lowercase hex).
func Coupon(id string) (uuid.UUID, error) {
	u, err := uuid.Parse(id)
	if len(id) != CouponIDLen || err != nil {
		return uuid.UUID{}, fmt.Errorf("%w: coupon_id must be a UUID as IssueCoupon answers it (8-4-4-4-12 hex digits), got %d bytes", ErrInvalid, len(id))
	}
	return u, nil
}
