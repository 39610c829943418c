package netcap

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/gopacket/gopacket/afpacket"

	"github.com/agentjail/agentjail/internal/errdefs"
)

// Ring geometry of a capture. A block must hold the largest packet seen on
// a veth (a 64 KiB GSO packet); blockTimeout bounds how long a packet waits
// in a partly filled block, and so how long Stop waits for the last ones.
const (
	captureBlockSize    = 1 << 20
	captureBlocks       = 16
	captureBlockTimeout = 10 * time.Millisecond
	capturePollTimeout  = 50 * time.Millisecond
	captureSnaplen      = 262144
)

// Capture records every packet of one network interface, both directions,
// to a pcap file (Ethernet link type, nanosecond timestamps), with an
// AF_PACKET TPACKET_V3 ring.
type Capture struct {
	ifname string
	path   string
	tp     *afpacket.TPacket
	f      *os.File
	bw     *bufio.Writer
	w      *pcapWriter
	// maxBytes bounds the file (0: no bound); size is what it holds (the
	// reader's).
	maxBytes, size int64

	mu      sync.Mutex
	stopAt  time.Time // zero while running
	done    chan struct{}
	packets uint64
	// overBound counts the packets left out because the file reached
	// maxBytes.
	overBound uint64
	err       error // why the reader stopped early

	stopOnce sync.Once
	result   stopResult
}

type stopResult struct {
	packets, dropped uint64
	err              error
}

// StartCapture starts recording the packets of interface ifname to a new
// pcap file at path (created with mode 0600; an existing file is a
// conflict), of at most maxBytes (0: no bound; the packets past it are
// counted, see OverBound). The interface is looked up, and the capture
// socket created, in the network namespace of the calling thread. The
// capture runs until Stop, or until the interface goes away. On error
// nothing is left behind (no socket, no file).
func StartCapture(ifname, path string, maxBytes int64) (*Capture, error) {
	if ifname == "" {
		return nil, errdefs.Invalidf("capture: interface: must not be empty")
	}
	if path == "" {
		return nil, errdefs.Invalidf("capture: path: must not be empty")
	}
	tp, err := afpacket.NewTPacket(
		afpacket.OptInterface(ifname),
		afpacket.TPacketVersion3,
		afpacket.OptFrameSize(captureBlockSize),
		afpacket.OptBlockSize(captureBlockSize),
		afpacket.OptNumBlocks(captureBlocks),
		afpacket.OptBlockTimeout(captureBlockTimeout),
		afpacket.OptPollTimeout(capturePollTimeout),
	)
	if err != nil {
		if _, lerr := net.InterfaceByName(ifname); lerr != nil {
			return nil, errdefs.NotFoundf("capture: interface %s: %v", ifname, lerr)
		}
		return nil, fmt.Errorf("capture: open AF_PACKET ring on %s: %w", ifname, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		tp.Close()
		if errors.Is(err, os.ErrExist) {
			return nil, errdefs.Conflictf("capture: file %s already exists", path)
		}
		return nil, fmt.Errorf("capture: create %s: %w", path, err)
	}
	c := &Capture{ifname: ifname, path: path, tp: tp, f: f, done: make(chan struct{}), maxBytes: maxBytes, size: pcapFileHeader}
	c.bw = bufio.NewWriterSize(f, 1<<20)
	c.w = &pcapWriter{w: c.bw}
	if err := c.w.writeFileHeader(captureSnaplen); err != nil {
		tp.Close()
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("capture: write header of %s: %w", path, err)
	}
	go c.run()
	return c, nil
}

// run copies packets from the ring to the file until Stop was called and
// the ring had time to hand over its last block, or until an error.
func (c *Capture) run() {
	defer close(c.done)
	for {
		data, ci, err := c.tp.ZeroCopyReadPacketData()
		switch {
		case err == nil:
			if len(data) > captureSnaplen {
				data = data[:captureSnaplen]
			}
			rec := int64(pcapRecordHeader + len(data))
			if c.maxBytes > 0 && c.size+rec > c.maxBytes {
				c.mu.Lock()
				c.overBound++
				c.mu.Unlock()
				continue
			}
			c.size += rec
			if werr := c.w.writePacket(ci.Timestamp, ci.Length, data); werr != nil {
				c.fail(fmt.Errorf("capture: write %s: %w", c.path, werr))
				return
			}
			c.mu.Lock()
			c.packets++
			c.mu.Unlock()
		case errors.Is(err, afpacket.ErrTimeout):
			c.mu.Lock()
			stopAt := c.stopAt
			c.mu.Unlock()
			// A packet sent before Stop sits in a block the kernel retires
			// within captureBlockTimeout; a poll timeout after that means
			// the ring is empty.
			if !stopAt.IsZero() && time.Since(stopAt) >= 2*captureBlockTimeout {
				return
			}
		case errors.Is(err, afpacket.ErrPoll):
			// The socket reports an error (ENETDOWN) once its interface is
			// down or gone: the capture is complete.
			return
		default:
			c.fail(fmt.Errorf("capture: read %s: %w", c.ifname, err))
			return
		}
	}
}

func (c *Capture) fail(err error) {
	c.mu.Lock()
	c.err = err
	c.mu.Unlock()
}

// OverBound returns how many packets were left out so far because the
// file reached its bound.
func (c *Capture) OverBound() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.overBound
}

// Packets returns how many packets were written so far.
func (c *Capture) Packets() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.packets
}

// Stop ends the capture once the packets the interface carried before the
// call are written, closes the file and the socket, and returns how many
// packets the file holds and how many the kernel dropped because the ring
// was full. err reports a failure of the capture or of closing the file;
// the counts are valid either way. Calling Stop again returns the same
// results.
func (c *Capture) Stop() (packets, dropped uint64, err error) {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		c.stopAt = time.Now()
		c.mu.Unlock()
		<-c.done
		_, st, serr := c.tp.SocketStats()
		c.tp.Close()
		c.mu.Lock()
		r := stopResult{packets: c.packets, err: c.err}
		c.mu.Unlock()
		if serr != nil {
			r.err = errors.Join(r.err, fmt.Errorf("capture: statistics of %s: %w", c.ifname, serr))
		} else {
			r.dropped = uint64(st.Drops())
		}
		if ferr := c.bw.Flush(); ferr != nil {
			r.err = errors.Join(r.err, fmt.Errorf("capture: write %s: %w", c.path, ferr))
		}
		if ferr := c.f.Close(); ferr != nil {
			r.err = errors.Join(r.err, fmt.Errorf("capture: close %s: %w", c.path, ferr))
		}
		c.result = r
	})
	return c.result.packets, c.result.dropped, c.result.err
}
