package telemetry

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"testing"
)

// TestMemberHashIsHMAC: the pooled, pre-keyed states give HMAC-SHA256 under the member key,
// first 16 bytes in hex, whatever id the state hashed before (a longer one, the same one).
func TestMemberHashIsHMAC(t *testing.T) {
	for _, id := range []string{"a-much-longer-member-id-0000000000001", "m1", "m1", "", "member-0000002"} {
		m := hmac.New(sha256.New, memberKey())
		m.Write([]byte(id))
		if got, want := MemberHash(id), hex.EncodeToString(m.Sum(nil)[:16]); got != want {
			t.Errorf("MemberHash(%q) = %s, want %s", id, got, want)
		}
	}
}
