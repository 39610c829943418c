package netcap

import (
	"encoding/binary"
	"io"
	"time"
)

// The capture file is classic pcap with nanosecond timestamps (magic
// 0xa1b23c4d, version 2.4, little-endian), which tcpdump, tshark and
// Wireshark read. It is written here rather than with gopacket's pcapgo:
// pcapgo pulls in gopacket/layers, whose package initialisation fills
// about 5 MiB of lookup tables in every process of the agentjail binary,
// the in-jail init and its shims included, where that memory is then
// carried by every jail and dumped and restored with every snapshot.
const (
	pcapMagicNanos   = 0xa1b23c4d
	pcapLinkEthernet = 1
	// The sizes of the file's header and of each record's.
	pcapFileHeader   = 24
	pcapRecordHeader = 16
)

// pcapWriter writes a pcap stream.
type pcapWriter struct {
	w   io.Writer
	hdr [16]byte
}

// writeFileHeader writes the 24-byte file header for Ethernet frames
// captured up to snaplen bytes.
func (p *pcapWriter) writeFileHeader(snaplen uint32) error {
	var h [24]byte
	binary.LittleEndian.PutUint32(h[0:], pcapMagicNanos)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	// thiszone and sigfigs stay zero.
	binary.LittleEndian.PutUint32(h[16:], snaplen)
	binary.LittleEndian.PutUint32(h[20:], pcapLinkEthernet)
	_, err := p.w.Write(h[:])
	return err
}

// writePacket writes one record: data as captured (at most the snap
// length) of a packet that was length bytes on the wire.
func (p *pcapWriter) writePacket(ts time.Time, length int, data []byte) error {
	ns := ts.UnixNano()
	binary.LittleEndian.PutUint32(p.hdr[0:], uint32(ns/1e9))
	binary.LittleEndian.PutUint32(p.hdr[4:], uint32(ns%1e9))
	binary.LittleEndian.PutUint32(p.hdr[8:], uint32(len(data)))
	binary.LittleEndian.PutUint32(p.hdr[12:], uint32(max(length, len(data))))
	if _, err := p.w.Write(p.hdr[:]); err != nil {
		return err
	}
	_, err := p.w.Write(data)
	return err
}
