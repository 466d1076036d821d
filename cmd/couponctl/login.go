package main

import (
	"errors"
	"fmt"
	"os/user"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// loginAttempt is what a refused login's hint may say about the attempt: whom it logged in as, how,
// and from which operating-system account.
type loginAttempt struct {
	User     string // the database user the server refused
	Database string
	OSUser   string // the operating-system user this process runs as
	Socket   bool   // over a Unix-domain socket (the host is a directory), where peer authentication applies
	Password bool   // a password was sent (DATABASE_URL, DB_PASS, PGPASSWORD or a passfile)
}

// loginKind is the kind of a refused login, as the server's message names it.
type loginKind string

// The kinds of refused login [loginHint] tells apart.
const (
	loginPeer     loginKind = "peer authentication"
	loginIdent    loginKind = "ident authentication"
	loginPassword loginKind = "password authentication"
	loginIAM      loginKind = "Cloud SQL IAM authentication"
	loginNoRole   loginKind = "no such database user"
	loginNoLogin  loginKind = "a role that may not log in"
	loginHBA      loginKind = "no pg_hba.conf line allows it"
	loginReject   loginKind = "a pg_hba.conf reject line"
	loginMethod   loginKind = "another authentication method" // LDAP, PAM, GSSAPI, certificate, ...
	loginUnknown  loginKind = "unknown"                       // a message it does not know (another language, say)
)

// classify names the kind of a refused login from the server's message (PostgreSQL's
// src/backend/libpq/auth.c and postinit.c, and Cloud SQL's IAM messages, in English), and for
// loginMethod the method. SQLSTATE 28P01 (invalid_password) is a password refusal whatever
// language the message is in; any other message it does not know is loginUnknown, never a guess.
func classify(pgErr *pgconn.PgError) (loginKind, string) {
	if pgErr.Code == pgerrcode.InvalidPassword {
		return loginPassword, ""
	}
	msg := pgErr.Message
	for _, k := range loginMessages {
		if strings.HasPrefix(msg, k.prefix) && strings.HasSuffix(msg, k.suffix) {
			return k.kind, ""
		}
	}
	if method, _, ok := strings.Cut(msg, " authentication failed for user"); ok && method != "" && !strings.Contains(method, ":") {
		return loginMethod, method
	}
	if strings.HasPrefix(msg, "certificate validation") {
		return loginMethod, "certificate"
	}
	return loginUnknown, ""
}

// loginMessages are the server's refusals that name their kind, by how the message starts and
// ends (PostgreSQL 15's messages, and Cloud SQL's IAM ones).
var loginMessages = []struct {
	prefix, suffix string
	kind           loginKind
}{
	{"Peer authentication failed", "", loginPeer},
	{"Ident authentication failed", "", loginIdent},
	{"Cloud SQL IAM ", "", loginIAM},
	{"password authentication failed", "", loginPassword},
	{"role ", " does not exist", loginNoRole},
	{"role ", " is not permitted to log in", loginNoLogin},
	{"no pg_hba.conf entry", "", loginHBA},
	{"pg_hba.conf rejects connection", "", loginReject},
}

// peerHint is [loginHint] for a refused peer login of database user u by OS user osUser.
func peerHint(u, osUser string) string {
	if osUser == "" || osUser == u {
		return fmt.Sprintf("over a Unix socket the server lets an OS user in only as the database user "+
			"of the same name, or as its pg_ident.conf map allows, and it did not let OS user %q in as %q: "+
			"connect over TCP (host=127.0.0.1) with the user's password instead", osUser, u)
	}
	return fmt.Sprintf("over a Unix socket the server lets an OS user in only as the database user of "+
		"the same name, and couponctl runs as OS user %q, not %q: either create database user %q once "+
		"(%s) and leave user= out of DATABASE_URL, or run couponctl as OS user %q",
		osUser, u, osUser, createUser(osUser, osUser), u)
}

// passwordHint is [loginHint] for a refused password login of u, sent is whether one was sent.
func passwordHint(u string, sent bool) string {
	if sent {
		return fmt.Sprintf("the server refused the password sent for %q: check DB_PASS (Cloud SQL "+
			"without DB_IAM_AUTH) or the password in DATABASE_URL (postgres://USER:PASSWORD@HOST/DB)", u)
	}
	return fmt.Sprintf("the server asks %q for a password and none was sent: give it in DATABASE_URL "+
		"(postgres://USER:PASSWORD@HOST/DB) or PGPASSWORD, or DB_PASS on Cloud SQL; a Cloud SQL IAM "+
		"user logs in with DB_IAM_AUTH=true and no password", u)
}

// loginHint says, for a login the server refused (SQLSTATE class 28, invalid authorization
// specification), what the server refused and what to change, chosen from the refusal's kind:
// peer or ident authentication (the OS user must match the database user), a password
// (DB_PASS, or DATABASE_URL's), Cloud SQL IAM (DB_IAM_AUTH, DB_USER and the account's grants),
// a missing or NOLOGIN role, or pg_hba.conf. For a message it does not know it names the
// causes by method rather than guess one.
func loginHint(pgErr *pgconn.PgError, a loginAttempt) (loginKind, string) {
	kind, method := classify(pgErr)
	u, osUser := a.User, a.OSUser
	switch kind {
	case loginPeer:
		return kind, peerHint(u, osUser)
	case loginIdent:
		return kind, fmt.Sprintf("the server asked which OS user opened the connection, and lets in only the "+
			"database user of that name (or one its pg_ident.conf map allows), not %q: log in as the database "+
			"user named as your OS user (%q), or run couponctl as OS user %q", u, osUser, u)
	case loginPassword:
		return kind, passwordHint(u, a.Password)
	case loginIAM:
		return kind, fmt.Sprintf("the instance did not accept this process's Google credentials as database "+
			"user %q: with DB_IAM_AUTH=true, DB_USER is the service account's email without "+
			"\".gserviceaccount.com\" (a person's email as is), added to the instance as an IAM user, and the "+
			"credentials couponctl runs with (Application Default Credentials) are that account's, holding "+
			"roles/cloudsql.instanceUser and roles/cloudsql.client (docs/deploy.md)", u)
	case loginNoRole:
		return kind, fmt.Sprintf("the server has no database user %q: create it as the server's superuser "+
			"(on Debian: %s), or name an existing one (user= in DATABASE_URL, or DB_USER)", u, createUser(u, osUser))
	case loginNoLogin:
		return kind, fmt.Sprintf("database user %q exists but may not log in (NOLOGIN, as the group roles "+
			"coupon_issue, coupon_relay and coupon_admin are): log in as a user that is granted it "+
			"(docs/roles.md)", u)
	case loginHBA:
		return kind, fmt.Sprintf("no line of the server's pg_hba.conf lets user %q into database %q from this "+
			"host with this encryption (the server's message names them): add one, or connect as a line "+
			"allows (over the Unix socket, or with sslmode=require)", u, a.Database)
	case loginReject:
		return kind, fmt.Sprintf("a reject line of the server's pg_hba.conf matches user %q, database %q and "+
			"this host: connect as another user or from where the server allows", u, a.Database)
	case loginMethod:
		return kind, fmt.Sprintf("the server's pg_hba.conf asks user %q for %s credentials here, and they were "+
			"refused: check them, or connect where pg_hba.conf allows another method", u, method)
	}
	return kind, fmt.Sprintf("the server refused to log in user %q, and its message says why; by the method "+
		"its pg_hba.conf chose: peer or ident, the OS user (%q) must match the database user; password, "+
		"DB_PASS or DATABASE_URL's password; Cloud SQL IAM, DB_IAM_AUTH, DB_USER and the account's grants",
		u, osUser)
}

// createUser is the Debian command that makes name a database superuser, as osUser runs it:
// root becomes the postgres account with su (a minimal system has no sudo), anyone else with sudo.
func createUser(name, osUser string) string {
	if osUser == "root" {
		return fmt.Sprintf(`su postgres -c "createuser --superuser %s"`, name)
	}
	return fmt.Sprintf(`sudo -u postgres createuser --superuser %s`, name)
}

// loginError is a login the server refused, with what it refused and what to change.
type loginError struct {
	Attempt loginAttempt
	Kind    loginKind
	Hint    string
	Server  *pgconn.PgError // the server's refusal: its message and SQLSTATE, 28000 or 28P01
	Err     error           // the error as the verb met it, Server in its chain
}

// Error says what the server refused, what to change, and the server's own words; the words
// the verb's path added (the functions' short start-up hint among them) give way to it.
func (e *loginError) Error() string {
	kind := string(e.Kind)
	if e.Kind == loginUnknown {
		kind = "SQLSTATE " + e.Server.Code
	}
	return fmt.Sprintf("database refused to log in user %q (%s): %s: %v", e.Attempt.User, kind, e.Hint, e.Server)
}

func (e *loginError) Unwrap() error { return e.Err }

// explainLogin returns err as a [loginError] when it is a login the server refused (SQLSTATE
// class 28), with [loginHint]'s hint for the attempt pgx made (its user, socket and password)
// from this process's OS user; any other error, or one already explained, it returns as is.
func explainLogin(err error) error {
	var pgErr *pgconn.PgError
	if err == nil || errors.As(err, new(*loginError)) || !errors.As(err, &pgErr) ||
		!pgerrcode.IsInvalidAuthorizationSpecification(pgErr.Code) {
		return err
	}
	var a loginAttempt
	var connErr *pgconn.ConnectError
	if errors.As(err, &connErr) && connErr.Config != nil {
		a.User, a.Database = connErr.Config.User, connErr.Config.Database
		a.Socket = strings.HasPrefix(connErr.Config.Host, "/")
		a.Password = connErr.Config.Password != ""
	}
	if me, uerr := user.Current(); uerr == nil {
		a.OSUser = me.Username
	}
	kind, hint := loginHint(pgErr, a)
	return &loginError{Attempt: a, Kind: kind, Hint: hint, Server: pgErr, Err: err}
}
