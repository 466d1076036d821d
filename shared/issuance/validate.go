package issuance

import "fmt"

// Formats of CONTRACT.md: a member id is 1-128 bytes of visible ASCII (0x21-0x7E); a campaign id
// is 1-64 bytes of [A-Za-z0-9_-]. The schema states the same as CHECK constraints.
const (
	MaxMemberIDLen   = 128
	MaxCampaignIDLen = 64
)

// Validate returns a wrapped [ErrInvalidRequest] naming the first id that breaks its format.
func Validate(memberID, campaignID string) error {
	if n := len(memberID); n < 1 || n > MaxMemberIDLen {
		return fmt.Errorf("%w: member_id must be 1-%d bytes, got %d", ErrInvalidRequest, MaxMemberIDLen, n)
	}
	for i := 0; i < len(memberID); i++ {
		if c := memberID[i]; c < 0x21 || c > 0x7e {
			return fmt.Errorf("%w: member_id must be visible ASCII (0x21-0x7E), byte %d is 0x%02X", ErrInvalidRequest, i, c)
		}
	}
	if n := len(campaignID); n < 1 || n > MaxCampaignIDLen {
		return fmt.Errorf("%w: campaign_id must be 1-%d bytes, got %d", ErrInvalidRequest, MaxCampaignIDLen, n)
	}
	for i := 0; i < len(campaignID); i++ {
		if c := campaignID[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fmt.Errorf("%w: campaign_id must be [A-Za-z0-9_-], byte %d is 0x%02X", ErrInvalidRequest, i, c)
		}
	}
	return nil
}
