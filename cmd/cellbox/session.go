package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cellbox/cellbox/sandbox/api"
	"github.com/cellbox/cellbox/sandboxclient"
	"github.com/cellbox/cellbox/server"
)

func init() {
	register(command{
		name:  "session",
		usage: "new [--server URL] [--data DIR] [--env K=V]... [--workspace-dir DIR] [--destroy-on-close] | rm [--server URL] [--token T | --data DIR] ID  create a session (prints export lines) or delete one (with its token, or the server key of --data / CELLBOX_KEY)",
		run:   runSession,
	})
}

// clientFlags are the flags of the commands that talk to a server; they
// default to CELLBOX_SERVER, CELLBOX_SESSION and CELLBOX_TOKEN.
type clientFlags struct {
	server, session, token *string
}

func addClientFlags(fs *flag.FlagSet, withSession bool) clientFlags {
	c := clientFlags{server: envString(fs, "server", "CELLBOX_SERVER", "http://"+defaultAddr, "server `URL`")}
	if withSession {
		c.session = envString(fs, "session", "CELLBOX_SESSION", "", "session `id`")
	}
	c.token = envString(fs, "token", "CELLBOX_TOKEN", "", "session `token`")
	return c
}

// envString declares a string flag whose default is environment variable
// env, else def. Its help names the variable, never its value: the value
// may be a secret (CELLBOX_TOKEN; a URL with a password) and help and usage
// (printed at any wrong flag) end up in logs.
func envString(fs *flag.FlagSet, name, env, def, usage string) *string {
	v := hiddenString(def)
	if e := os.Getenv(env); e != "" {
		v = hiddenString(e)
	}
	if def != "" {
		usage += fmt.Sprintf(" (default: $%s, else %s)", env, def)
	} else {
		usage += fmt.Sprintf(" (default: $%s)", env)
	}
	fs.Var(&v, name, usage)
	return (*string)(&v)
}

// hiddenString is a string flag whose value the flag package does not
// print (its String is what it prints as the default).
type hiddenString string

func (h *hiddenString) String() string { return "" }

func (h *hiddenString) Set(s string) error {
	*h = hiddenString(s)
	return nil
}

func runSession(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("want a subcommand: new or rm ID")
	}
	fs := flag.NewFlagSet("session "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "new":
		cf := addClientFlags(fs, false)
		data := fs.String("data", server.DefaultDataDir(), "data directory of the server, where its key is (DATA/"+server.KeyFile+"); env "+server.KeyEnv+" overrides")
		var opts api.NewSessionRequest
		env := envFlag{}
		fs.Var(env, "env", "KEY=VALUE: an environment variable of every box of the session (repeat the flag for more)")
		fs.StringVar(&opts.WorkspaceDir, "workspace-dir", "", "working directory of the session's boxes (default /workspace; /workspace, /tmp or below)")
		fs.BoolVar(&opts.DestroyOnClose, "destroy-on-close", false, "destroy the session's boxes when the last MCP session served on it ends (one-shot runs)")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if len(env) > 0 {
			opts.Env = env
		}
		key := server.ClientKey(*data)
		if key == "" {
			return fmt.Errorf("no server key: creating a session needs the key of cellbox serve; give its --data DIR (the key is DATA/%s) or set %s", server.KeyFile, server.KeyEnv)
		}
		server := serverOf(fs, *cf.server, *data)
		c, err := sandboxclient.NewSessionWithOptions(ctx, server, key, opts)
		if err != nil {
			return err
		}
		id, token := c.Session()
		fmt.Printf("export CELLBOX_SERVER=%s\nexport CELLBOX_SESSION=%s\nexport CELLBOX_TOKEN=%s\n", server, id, token)
		return nil
	case "rm":
		cf := addClientFlags(fs, false)
		data := fs.String("data", server.DefaultDataDir(), "data directory of the server, where its key is (DATA/"+server.KeyFile+"; env "+server.KeyEnv+" overrides): the server key deletes any session, e.g. one whose token is lost")
		pos, err := parseArgs(fs, args[1:]) // session rm ID --data DIR
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return errors.New("want the id of the session to delete")
		}
		// The session's own token unless --data asks for the server key,
		// or no token is at hand.
		cred := *cf.token
		if flagsGiven(fs)["data"] || cred == "" {
			if cred = server.ClientKey(*data); cred == "" {
				return fmt.Errorf("no token and no server key: pass the session's --token (or set CELLBOX_TOKEN), or the server's --data DIR (its key is DATA/%s) or set %s", server.KeyFile, server.KeyEnv)
			}
		}
		return sandboxclient.New(serverOf(fs, *cf.server, *data), pos[0], cred).DeleteSession(ctx)
	}
	return fmt.Errorf("unknown subcommand %q: want new or rm", args[0])
}

// envFlag collects repeated KEY=VALUE flags.
type envFlag map[string]string

func (e envFlag) String() string { return "" }

func (e envFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want KEY=VALUE", s)
	}
	e[k] = v
	return nil
}

// flagsGiven returns the names of the flags of fs given on the command
// line.
func flagsGiven(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// serverOf is the server URL a client command uses: --server or
// CELLBOX_SERVER when given, else the URL the server over data wrote
// (DATA/server.url) while it runs, else the default address.
func serverOf(fs *flag.FlagSet, flagValue, data string) string {
	if flagsGiven(fs)["server"] || os.Getenv("CELLBOX_SERVER") != "" || data == "" {
		return flagValue
	}
	if b, err := os.ReadFile(filepath.Join(data, server.URLFile)); err == nil {
		if u := strings.TrimSpace(string(b)); strings.HasPrefix(u, "http://") || strings.HasPrefix(u, "https://") {
			return u
		}
	}
	return flagValue
}
