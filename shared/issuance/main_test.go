package issuance_test

import (
	"testing"

	"github.com/mops/coupon-api/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
