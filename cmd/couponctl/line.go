package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/mops/coupon-api/internal/ops/outboxadmin"
	"github.com/mops/coupon-api/shared/ids"
)

func lineCmd() *cobra.Command {
	return groupCmd("line", "Link members to the LINE user ids their coupon notifications are pushed to",
		lineLinkCmd(), lineUnlinkCmd())
}

func lineLinkCmd() *cobra.Command {
	var member, lineUser string
	c := &cobra.Command{
		Use:   "link --member M --line-user U",
		Short: "Link a member to a LINE user id (replacing an earlier link)",
		Long: `Link a member to the LINE user id that RelayOutbox pushes the member's coupons to: "U" and 32
lowercase hex digits, as LINE gives it for the channel (not the LINE ID users type). The members
system fills this table; the verb is for operators and tests. Rows already skipped for this
member stay skipped until "couponctl outbox requeue" reopens them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := ids.Member(member); err != nil {
				return usageError{err}
			}
			if err := outboxadmin.CheckLINEUserID(lineUser); err != nil {
				return usageError{err}
			}
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			if err := outboxadmin.Link(cmd.Context(), pool, member, lineUser); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "linked %s to LINE user %s\n", member, lineUser)
			return nil
		},
	}
	c.Flags().StringVar(&member, "member", "", "member id (required)")
	c.Flags().StringVar(&lineUser, "line-user", "", "LINE user id, U + 32 lowercase hex digits (required)")
	_ = c.MarkFlagRequired("member")
	_ = c.MarkFlagRequired("line-user")
	return c
}

func lineUnlinkCmd() *cobra.Command {
	var member string
	c := &cobra.Command{
		Use:   "unlink --member M",
		Short: "Remove a member's LINE account: their coupons not yet pushed are skipped",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, closePool, err := openMigrated(cmd.Context())
			if err != nil {
				return err
			}
			defer closePool()
			had, err := outboxadmin.Unlink(cmd.Context(), pool, member)
			if err != nil {
				return err
			}
			if !had {
				return fmt.Errorf("member %s has no LINE account linked", member)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "unlinked %s\n", member)
			return nil
		},
	}
	c.Flags().StringVar(&member, "member", "", "member id (required)")
	_ = c.MarkFlagRequired("member")
	return c
}
