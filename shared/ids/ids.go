// Package ids holds the formats of the identifiers callers send (docs/api.md, "IssueCoupon"):
// the request decoder, the issuance service, campaign creation and couponctl check ids here, and
// the schema states the same formats as CHECK constraints (member_id_format, campaign_id_format).
package ids

import (
	"errors"
	"fmt"
)

// Lengths in bytes.
const (
	MaxMemberIDLen   = 128 // member_id: 1-128 bytes of visible ASCII (0x21-0x7E)
	MaxCampaignIDLen = 64  // campaign_id: 1-64 bytes of [A-Za-z0-9_-]
)

// ErrInvalid is wrapped by every error of this package: an id that breaks its format.
var ErrInvalid = errors.New("invalid id")

// Member returns a wrapped [ErrInvalid] when id is not 1-128 bytes of visible ASCII.
func Member(id string) error {
	if n := len(id); n < 1 || n > MaxMemberIDLen {
		return fmt.Errorf("%w: member_id must be 1-%d bytes, got %d", ErrInvalid, MaxMemberIDLen, n)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: member_id must be visible ASCII (0x21-0x7E), byte %d is 0x%02X", ErrInvalid, i, c)
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
