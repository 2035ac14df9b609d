package main

import "github.com/cellbox/cellbox/sandbox/agent/agentcmd"

func init() {
	register(command{name: "agent", usage: agentcmd.Usage, run: agentcmd.Run})
}
