package bpf

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Bits of a ring record header's length word (include/uapi/linux/bpf.h:
// BPF_RINGBUF_BUSY_BIT, BPF_RINGBUF_DISCARD_BIT) and the header's size.
const (
	ringBusy    = 1 << 31
	ringDiscard = 1 << 30
	ringHdrSize = 8
)

// ring reads the records of a BPF ring buffer map where the kernel wrote
// them, and tells the kernel it consumed them once per batch.
//
// cilium/ebpf's ringbuf.Reader copies every record out and publishes the
// consumer position after each one; at millions of records a second that
// store, and the load of the producer position beside it, move a cache line
// between the consumer's CPU and the producing task's for every record, and
// the producer pays for it in each reservation. Here the producer position
// is read once per batch of what it announced and the consumer position
// published when a batch is done.
//
// A ring belongs to one goroutine.
type ring struct {
	cons, prod []byte   // the consumer page (read-write), the producer page and data (read-only)
	consPos    *uintptr // in cons: what the kernel may overwrite up to
	prodPos    *uintptr // in prod: what the kernel has reserved up to
	data       []byte   // the data pages, mapped twice in a row: no record wraps
	mask       uintptr
	pos        uintptr // the next record's position, published by release
	seen       uintptr // the producer position last read
}

// openRing maps m, a BPF_MAP_TYPE_RINGBUF map, for reading.
func openRing(m *ebpf.Map) (*ring, error) {
	size := int(m.MaxEntries())
	if m.Type() != ebpf.RingBuf || size <= 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("map %s: not a ring buffer of a power-of-two size", m)
	}
	page := os.Getpagesize()
	cons, err := unix.Mmap(m.FD(), 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map the ring's consumer page: %w", err)
	}
	prod, err := unix.Mmap(m.FD(), int64(page), page+2*size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		unix.Munmap(cons)
		return nil, fmt.Errorf("map the ring's data pages: %w", err)
	}
	r := &ring{
		cons:    cons,
		prod:    prod,
		consPos: (*uintptr)(unsafe.Pointer(&cons[0])),
		prodPos: (*uintptr)(unsafe.Pointer(&prod[0])),
		data:    prod[page:],
		mask:    uintptr(size - 1),
	}
	r.pos = atomic.LoadUintptr(r.consPos)
	r.seen = r.pos
	return r, nil
}

// available returns the bytes the kernel has reserved beyond the last
// published consumer position.
func (r *ring) available() uint64 {
	return uint64(atomic.LoadUintptr(r.prodPos) - atomic.LoadUintptr(r.consPos))
}

// next returns the next committed record, in place: it stays valid until
// release. It returns nil when the ring holds no further committed record
// (it is empty, or the next record is still being written), and an error
// when a record's length runs past what the kernel announced.
func (r *ring) next() ([]byte, error) {
	for {
		if r.pos == r.seen {
			r.seen = atomic.LoadUintptr(r.prodPos)
			if r.pos == r.seen {
				return nil, nil
			}
		}
		// The length word is written last, with an atomic exchange: loading it
		// atomically orders the record's bytes before their use.
		hdr := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.data[r.pos&r.mask])))
		if hdr&ringBusy != 0 {
			return nil, nil
		}
		n := uintptr(hdr &^ (ringBusy | ringDiscard))
		if step := ringHdrSize + (n+7)&^7; step > r.seen-r.pos {
			return nil, fmt.Errorf("ring record at %d: %d bytes, %d announced", r.pos, n, r.seen-r.pos)
		}
		start := (r.pos + ringHdrSize) & r.mask
		r.pos += ringHdrSize + (n+7)&^7
		if hdr&ringDiscard != 0 {
			continue
		}
		return r.data[start : start+n : start+n], nil
	}
}

// release gives the records returned by next back to the kernel.
func (r *ring) release() {
	atomic.StoreUintptr(r.consPos, r.pos)
}

// close unmaps the ring.
func (r *ring) close() error {
	return errors.Join(unix.Munmap(r.prod), unix.Munmap(r.cons))
}
