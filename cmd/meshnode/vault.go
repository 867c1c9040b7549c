package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/meshnode/meshnode/api"
	"github.com/meshnode/meshnode/config"
	"github.com/meshnode/meshnode/sdk"
	"github.com/meshnode/meshnode/vault"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
)

func newVaultCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vault",
		Short: "Mint, fetch, rotate and list the mesh's secrets (values never enter a stream)",
	}
	cmd.AddCommand(newVaultMintCmd(), newVaultFetchCmd(), newVaultRotateCmd(), newVaultLsCmd(), newVaultRecoveryKeyCmd())
	return cmd
}

func newVaultRecoveryKeyCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "recovery-key [--json]",
		Short: "Print the mesh's recovery key (the vault's barrier key), which restores a snapshot; operator only",
		Long: `Print the mesh's recovery key: the vault's barrier key, as MNRK1-… with a checksum, so a
mistyped key is refused before anything is decrypted. meshnode genesis --from-snapshot needs
it to open a snapshot's sealed foundation and the vault's records. Keep it offline, apart from
the snapshot files and from operator.nk: whoever holds a snapshot and this key holds every
secret of the mesh. The vault records each reading (event recovery-key-read).`,
		Example: `  meshnode vault recovery-key > /secure/mesh-recovery-key.txt`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var rk api.RecoveryKey
			if _, err := vaultCall(cmd, api.VaultVerbRecoveryKey, api.VaultRequest{}, &rk); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(rk)
			}
			fmt.Fprintln(cmd.OutOrStdout(), rk.Key)
			return nil
		},
	}
	addClientFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: mesh_id, key")
	return cmd
}

// vaultCall calls the vault as the operator.
func vaultCall(cmd *cobra.Command, verb string, req api.VaultRequest, out any) (metas []api.VaultMeta, err error) {
	err = withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		metas, err = vault.Call(ctx, nc, verb, api.VaultCallerOperator, req, out)
		return err
	})
	return metas, err
}

func addOwnerFlag(cmd *cobra.Command, owner *string) {
	*owner = api.VaultCallerOperator
	cmd.Flags().Var((*moduleFlag)(owner), "owner", "the module the secret belongs to (or operator)")
}

// givenValue reads the value the operator gives on stdin (one trailing newline dropped)
// and seals it into req for the vault's intake key.
func givenValue(cmd *cobra.Command, req *api.VaultRequest) error {
	b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20))
	if err != nil {
		return err
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if len(b) == 0 {
		return usagef("--value-stdin read nothing: pipe the value in, e.g. printf %%s \"$URL\" | meshnode vault mint NAME --value-stdin")
	}
	return withBus(cmd, func(ctx context.Context, nc *nats.Conn) error {
		return vault.Give(ctx, nc, api.VaultCallerOperator, req, b)
	})
}

func newVaultMintCmd() *cobra.Command {
	var owner string
	var given bool
	cmd := &cobra.Command{
		Use:   "mint NAME [--owner MODULE] [--value-stdin]",
		Short: "Mint a secret with a random value, or one read from stdin (fetch prints it)",
		Example: "  meshnode vault mint api-token --owner shop\n" +
			"  printf %s \"$PG_ADMIN_URL\" | meshnode vault mint admin-url --owner postgres-provisioner --value-stdin",
		Args: namedArgs(cobra.ExactArgs(1), argSecret),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s api.Secret
			req := api.VaultRequest{Owner: owner, Name: args[0]}
			if given {
				if err := givenValue(cmd, &req); err != nil {
					return err
				}
			}
			if _, err := vaultCall(cmd, api.VaultVerbMint, req, &s); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "minted %s of %s, version %d\n", s.Name, s.Owner, s.Version)
			return nil
		},
	}
	addClientFlags(cmd)
	addOwnerFlag(cmd, &owner)
	cmd.Flags().BoolVar(&given, "value-stdin", false, "the value is read from stdin (sealed to the vault's key on the way), not random")
	return cmd
}

func newVaultRotateCmd() *cobra.Command {
	var owner string
	var given bool
	grace := config.Duration(vault.DefaultGrace)
	cmd := &cobra.Command{
		Use:     "rotate NAME [--owner MODULE] [--grace 24h]",
		Short:   "Give a secret a new version (random, or read from stdin); the previous stays readable for --grace",
		Example: `  meshnode vault rotate api-token --owner shop --grace 24h`,
		Args:    namedArgs(cobra.ExactArgs(1), argSecret),
		RunE: func(cmd *cobra.Command, args []string) error {
			var s api.Secret
			req := api.VaultRequest{Owner: owner, Name: args[0], Grace: time.Duration(grace).String()}
			if given {
				if err := givenValue(cmd, &req); err != nil {
					return err
				}
			}
			if _, err := vaultCall(cmd, api.VaultVerbRotate, req, &s); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rotated %s of %s to version %d; readable versions %v\n", s.Name, s.Owner, s.Version, s.Versions)
			return nil
		},
	}
	addClientFlags(cmd)
	addOwnerFlag(cmd, &owner)
	cmd.Flags().Var(&grace, "grace", "how long the previous version stays readable (e.g. 12h, 7d)")
	cmd.Flags().BoolVar(&given, "value-stdin", false, "the new value is read from stdin (sealed to the vault's key on the way), not random")
	return cmd
}

func newVaultFetchCmd() *cobra.Command {
	var owner string
	var ver int
	cmd := &cobra.Command{
		Use:   "fetch NAME [--owner MODULE] [--version N]",
		Short: "Print a secret's value alone (as the operator, or with --creds as its module)",
		Example: `  meshnode vault fetch api-token --owner shop
  meshnode vault fetch api-token --creds shop.nk   # as the module`,
		Args: namedArgs(cobra.ExactArgs(1), argSecret),
		RunE: func(cmd *cobra.Command, args []string) error {
			var value string
			if cmd.Flags().Changed("creds") {
				if cmd.Flags().Changed("owner") {
					return usagef("--owner is the operator's: with --creds the module fetches its own secrets")
				}
				err := withModule(cmd, func(ctx context.Context, c *sdk.Client) (err error) {
					value, err = c.SecretVersion(ctx, args[0], ver)
					return err
				})
				if err != nil {
					return err
				}
			} else {
				var s api.Secret
				if _, err := vaultCall(cmd, api.VaultVerbFetch, api.VaultRequest{Owner: owner, Name: args[0], Version: ver}, &s); err != nil {
					if !cmd.Flags().Changed("owner") && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, nats.ErrNoResponders) {
						return withOwners(cmd, args[0], err) // the vault answered: ask it which owners have the name
					}
					return err
				}
				value = s.Value
			}
			fmt.Fprintln(cmd.OutOrStdout(), value)
			return nil
		},
	}
	addClientFlags(cmd)
	addOwnerFlag(cmd, &owner)
	cmd.Flags().IntVar(&ver, "version", 0, "a readable earlier version (default: the current one)")
	return cmd
}

// withOwners adds to err, a fetch of the operator's own secret name that failed, which
// modules own a secret of that name: --owner was likely forgotten.
func withOwners(cmd *cobra.Command, name string, err error) error {
	metas, lerr := vaultCall(cmd, api.VaultVerbList, api.VaultRequest{}, nil)
	if lerr != nil {
		return err
	}
	var owners []string
	for _, m := range metas {
		if m.Name == name && m.Owner != api.VaultCallerOperator {
			owners = append(owners, m.Owner)
		}
	}
	if len(owners) == 0 {
		return err
	}
	return fmt.Errorf("%w\nA secret %s is %s's: add --owner %s", err, name, strings.Join(owners, "'s and "), owners[0])
}

func newVaultLsCmd() *cobra.Command {
	var owner string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "ls [--owner MODULE]",
		Short: "List secrets: owner, name, versions — never values",
		Example: `  meshnode vault ls
  meshnode vault ls --owner shop --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			metas, err := vaultCall(cmd, api.VaultVerbList, api.VaultRequest{Owner: owner}, nil)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSONLines(cmd.OutOrStdout(), metas)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "OWNER\tNAME\tVERSION\tREADABLE\tCREATED")
			for _, m := range metas {
				vs := make([]string, len(m.Versions))
				for i, v := range m.Versions {
					vs[i] = fmt.Sprint(v)
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", m.Owner, m.Name, m.Version, strings.Join(vs, ","), m.Created.Format(time.RFC3339))
			}
			return tw.Flush()
		},
	}
	addClientFlags(cmd)
	cmd.Flags().Var((*moduleFlag)(&owner), "owner", "only this owner's secrets")
	cmd.Flags().BoolVar(&asJSON, "json", false, "one JSON object per secret: owner, name, version, created, versions?")
	return cmd
}

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Join tokens: single-use bearer credentials for adding nodes"}
	ttl := config.Duration(vault.DefaultTokenTTL)
	var uses int
	var asJSON bool
	create := &cobra.Command{
		Use:   "create [--ttl 1h] [--uses 1]",
		Short: "Mint a join token (it pins the mesh and names the node to contact)",
		Example: `  meshnode token create
  meshnode token create --ttl 24h --uses 2 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if uses < 1 {
				return usagef("--uses %d: a token is used at least once", uses)
			}
			if ttl <= 0 {
				return usagef("--ttl %s: must be positive", ttl)
			}
			var t api.Token
			if _, err := vaultCall(cmd, api.VaultVerbToken, api.VaultRequest{TTL: time.Duration(ttl).String(), Uses: uses}, &t); err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(map[string]any{"token": t.Token, "id": t.ID, "expires": t.Expires, "uses": t.Uses})
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.Token)
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s: %d use(s), expires %s; a bearer credential — hand it over privately\n", t.ID, t.Uses, t.Expires.Format(time.RFC3339))
			return nil
		},
	}
	addClientFlags(create)
	create.Flags().Var(&ttl, "ttl", "how long the token is valid (e.g. 1h, 7d)")
	create.Flags().IntVar(&uses, "uses", 1, "how many nodes may join with it")
	create.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: token, id, expires, uses")
	cmd.AddCommand(create)
	return cmd
}
