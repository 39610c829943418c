package observe

// Sink receives a jail's events from an event source (the tracer). Both
// methods are called from the source's single delivery goroutine and must
// not block: a slow sink stalls every jail's delivery.
type Sink interface {
	// Handle takes one event. ev is valid only during the call; a sink that
	// keeps it copies *ev.
	Handle(ev *Event)
	// Idle tells the sink that the source has drained its input for now
	// (called at least every poll period while the source runs), the moment
	// to flush buffers.
	Idle()
}

// SinkFunc adapts a function to Sink; its Idle does nothing.
type SinkFunc func(ev *Event)

// Handle calls f(ev).
func (f SinkFunc) Handle(ev *Event) { f(ev) }

// Idle does nothing.
func (f SinkFunc) Idle() {}

// Recorder is the Sink of one jail: it stores every event in the jail's
// JSONL files, publishes it on the jail's Bus, and derives file events from
// the syscall and process events with a FileTracker (storing and publishing
// those as well). Events flagged FlagInternal feed the tracker only.
type Recorder struct {
	w     *Writer
	bus   *Bus
	files *FileTracker
	// Observe, when set, sees every stored event (raw and derived) after
	// it was written and published: the place for in-line aggregation.
	Observe func(ev *Event)
}

// NewRecorder returns a Recorder writing to w and publishing on bus; either
// may be nil to skip that output. The Recorder owns both: Close closes them.
func NewRecorder(w *Writer, bus *Bus) *Recorder {
	r := &Recorder{w: w, bus: bus}
	r.files = NewFileTracker(r.record)
	return r
}

// Handle records ev, then the file events it implies.
func (r *Recorder) Handle(ev *Event) {
	r.record(ev)
	if ev.Type == TypeSyscall || ev.Type == TypeProc {
		r.files.Handle(ev)
	}
}

func (r *Recorder) record(ev *Event) {
	if ev.Flags&FlagInternal != 0 {
		return
	}
	if r.w != nil {
		r.w.Write(ev)
	}
	if r.bus != nil {
		r.bus.Publish(ev)
	}
	if r.Observe != nil {
		r.Observe(ev)
	}
}

// Health is the writer's Health: the events the disk refused so far and
// the error while it still refuses them (0, nil without a writer).
func (r *Recorder) Health() (uint64, error) {
	if r.w == nil {
		return 0, nil
	}
	return r.w.Health()
}

// OverBound is the writer's OverBound: the events refused because their
// file reached its bound, and why (0 and nil without a writer).
func (r *Recorder) OverBound() (uint64, error) {
	if r.w == nil {
		return 0, nil
	}
	return r.w.OverBound()
}

// Idle flushes the writer's partly filled buffers.
func (r *Recorder) Idle() {
	if r.w != nil {
		r.w.Flush()
	}
}

// Close flushes and closes the writer and closes the bus. Call it after the
// source stopped delivering (Tracer.Unwatch returned).
func (r *Recorder) Close() error {
	var err error
	if r.w != nil {
		err = r.w.Close()
	}
	if r.bus != nil {
		r.bus.Close()
	}
	return err
}
