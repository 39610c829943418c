package observe

import "time"

func nowNano() int64 { return time.Now().UnixNano() }
