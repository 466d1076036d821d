package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestLoginHint: each refusal's hint is chosen from the server's message (or SQLSTATE 28P01),
// speaks of what that server refused, and never of another kind's fix: peer and ident of OS and
// database users, a password of DB_PASS and DATABASE_URL, IAM of DB_IAM_AUTH and grants. A
// message it does not know (another language) gets the causes by method, never one guess.
func TestLoginHint(t *testing.T) {
	t.Parallel()
	root := loginAttempt{User: "postgres", Database: "coupons", OSUser: "root", Socket: true}
	alice := loginAttempt{User: "postgres", Database: "coupons", OSUser: "alice", Socket: true}
	tcp := loginAttempt{User: "coupon", Database: "coupons", OSUser: "root"}
	withPassword := tcp
	withPassword.Password = true
	for _, c := range []struct {
		code, message string
		a             loginAttempt
		kind          loginKind
		want, not     []string
	}{
		{"28000", `Peer authentication failed for user "postgres"`, root, loginPeer,
			[]string{`OS user "root"`, `not "postgres"`, `su postgres -c "createuser --superuser root"`, "user=", `as OS user "postgres"`},
			[]string{"DB_PASS", "IAM", "password"}},
		{"28000", `Peer authentication failed for user "postgres"`, alice, loginPeer,
			[]string{"sudo -u postgres createuser --superuser alice"},
			[]string{"su postgres -c", "DB_PASS", "IAM"}},
		{"28000", `Peer authentication failed for user "root"`, loginAttempt{User: "root", OSUser: "root", Socket: true}, loginPeer,
			[]string{"pg_ident.conf", "host=127.0.0.1"},
			[]string{"DB_PASS", "IAM", "createuser"}},
		{"28000", `Ident authentication failed for user "coupon"`, tcp, loginIdent,
			[]string{"OS user", `"root"`, `"coupon"`},
			[]string{"DB_PASS", "IAM"}},
		{"28P01", `password authentication failed for user "coupon"`, withPassword, loginPassword,
			[]string{"refused the password", "DB_PASS", "DATABASE_URL"},
			[]string{"OS user", "peer", "none was sent"}},
		{"28P01", `password authentication failed for user "coupon"`, tcp, loginPassword,
			[]string{"none was sent", "PGPASSWORD", "DB_PASS", "DB_IAM_AUTH=true"},
			[]string{"OS user", "peer"}},
		{"28P01", `la autentificación password falló para el usuario «coupon»`, withPassword, loginPassword,
			[]string{"DB_PASS"}, []string{"OS user"}},
		{"28000", `Cloud SQL IAM service account authentication failed for user "coupon-issue@p.iam"`, tcp, loginIAM,
			[]string{"DB_IAM_AUTH=true", "DB_USER", ".gserviceaccount.com", "roles/cloudsql.instanceUser", "roles/cloudsql.client"},
			[]string{"DB_PASS", "OS user", "peer"}},
		{"28000", `Cloud SQL IAM user authentication failed for user "ops@example.com"`, tcp, loginIAM,
			[]string{"DB_IAM_AUTH"}, []string{"DB_PASS"}},
		{"28000", `role "root" does not exist`, loginAttempt{User: "root", OSUser: "root", Socket: true}, loginNoRole,
			[]string{`no database user "root"`, `su postgres -c "createuser --superuser root"`, "DB_USER"},
			[]string{"DB_PASS", "IAM", "peer"}},
		{"28000", `role "coupon_issue" is not permitted to log in`, tcp, loginNoLogin,
			[]string{"NOLOGIN", "docs/roles.md"}, []string{"DB_PASS", "peer"}},
		{"28000", `no pg_hba.conf entry for host "10.0.0.9", user "coupon", database "coupons", no encryption`, tcp, loginHBA,
			[]string{"pg_hba.conf", `"coupon"`, `"coupons"`}, []string{"DB_PASS", "peer", "IAM"}},
		{"28000", `pg_hba.conf rejects connection for host "10.0.0.9", user "coupon", database "coupons", no encryption`, tcp, loginReject,
			[]string{"reject line"}, []string{"DB_PASS", "IAM"}},
		{"28000", `LDAP authentication failed for user "coupon"`, tcp, loginMethod,
			[]string{"LDAP credentials"}, []string{"DB_PASS", "IAM", "OS user"}},
		{"28000", `certificate authentication failed for user "coupon"`, tcp, loginMethod,
			[]string{"certificate credentials"}, []string{"DB_PASS", "IAM"}},
		{"28000", `Peer-Authentifizierung für Benutzer »postgres« fehlgeschlagen`, root, loginUnknown,
			[]string{"peer or ident", "DB_PASS", "DB_IAM_AUTH", `"root"`}, nil},
	} {
		kind, hint := loginHint(&pgconn.PgError{Severity: "FATAL", Code: c.code, Message: c.message}, c.a)
		if kind != c.kind {
			t.Errorf("%s %q: kind %q, want %q", c.code, c.message, kind, c.kind)
		}
		for _, w := range c.want {
			if !strings.Contains(hint, w) {
				t.Errorf("%q (%+v): hint does not say %q:\n%s", c.message, c.a, w, hint)
			}
		}
		for _, n := range c.not {
			if strings.Contains(hint, n) {
				t.Errorf("%q (%+v): hint says %q, which does not fit:\n%s", c.message, c.a, n, hint)
			}
		}
	}
}

// TestExplainLogin: only a login refusal (class 28) is explained, once, from the attempt pgx made;
// it still unwraps to the server's error.
func TestExplainLogin(t *testing.T) {
	t.Parallel()
	pgErr := &pgconn.PgError{Severity: "FATAL", Code: "28000", Message: `Peer authentication failed for user "postgres"`}
	if err := explainLogin(nil); err != nil {
		t.Errorf("explainLogin(nil) = %v", err)
	}
	other := fmt.Errorf("query: %w", &pgconn.PgError{Code: "42P01", Message: `relation "x" does not exist`})
	if got := explainLogin(other); got != other {
		t.Errorf("a non-login error was changed: %v", got)
	}
	err := explainLogin(fmt.Errorf("migrate: %w", pgErr))
	var le *loginError
	if !errors.As(err, &le) || le.Kind != loginPeer || le.Server.Code != "28000" {
		t.Fatalf("explainLogin(peer) = %#v", err)
	}
	if again := explainLogin(fmt.Errorf("verb: %w", err)); strings.Count(again.Error(), "database refused") != 1 {
		t.Errorf("explained twice: %v", again)
	}
	var back *pgconn.PgError
	if !errors.As(err, &back) || back != pgErr {
		t.Errorf("the server's error is no longer in the chain: %v", err)
	}
}
