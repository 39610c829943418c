package main

import "github.com/agentjail/agentjail/internal/initd"

// runInit runs the in-jail init (`agentjail init ...`) with the arguments
// after "init" and returns its exit code.
func runInit(args []string) int { return initd.Main(args) }
