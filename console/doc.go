// Package console is the promotion team's web console (issue 32): server-rendered Japanese
// pages over the campaigns, their burn-down, change requests, history and coupons, and HTML
// forms that pause, resume, end, change a budget, approve or reject a request and void a coupon.
//
// Every request is identified by its Identity-Aware Proxy assertion ([IAP]; 401 otherwise), and
// the person's email is what the database records: every change goes through the console_*
// functions (schema/current), which check the person's role (viewer, operator, approver) in the
// database, so that a button hidden from a viewer is refused by the database too. Every POST
// carries a CSRF token (gorilla/csrf; 403 otherwise), and every page a Content Security Policy
// that allows no script: the burn-down is drawn on the server as SVG.
//
// Deployed it is the Cloud Run service coupon-console ([Function], console/cmd); `couponctl
// console` serves the same handler ([New]) on this machine. docs/console.md describes the pages,
// who may do what, and what a page costs.
package console
