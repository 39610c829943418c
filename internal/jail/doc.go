// Package jail is the jail manager: it owns the lifecycle state machine of
// every jail, its record under DATA_DIR/jails/{id}/jail.json, recovery of
// running jails after a daemon restart, and routes exec and file requests
// to the jail's in-jail init.
package jail
