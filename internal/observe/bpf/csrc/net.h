/* Records and maps shared by the network observation programs and their Go
 * reader (bpf2go turns the structs into Go types). */
#ifndef AGENTJAIL_NET_H
#define AGENTJAIL_NET_H

#define NET_MAX_WATCHED 4096
#define FLOW_MAX 65536
#define DNS_MAX 2048
#define DNS_PORT 53

/* Directions (index of flow_val.bytes and .pkts, dns_ev.dir). */
enum net_dir {
	DIR_OUT = 0, /* sent by the jail's socket */
	DIR_IN = 1,  /* received by the jail's socket */
};

/* flow_val.flags */
enum flow_flag {
	FLOW_INBOUND = 1, /* the remote side started the flow */
	FLOW_FIN_OUT = 2, /* the jail sent a TCP FIN */
	FLOW_FIN_IN = 4,  /* the jail received a TCP FIN */
	FLOW_RST = 8,     /* a TCP RST crossed the flow */
	FLOW_OWNER = 16,  /* tgid, ns_tgid and comm are set */
};

/* One flow of a watched cgroup, seen from the jail: local is the jail's
 * address. Ports are in host byte order, addresses in network order (IPv4
 * in the first four bytes). */
struct flow_key {
	u64 cgroup;
	u8 family; /* 4 or 6 */
	u8 proto;  /* IPPROTO_* */
	u16 lport;
	u16 rport;
	u16 pad;
	u8 laddr[16];
	u8 raddr[16];
};

/* The flow's counters. Bytes are IP-layer bytes (the IP header, the
 * transport header and the payload) of the skbs the socket sent or
 * received; a GSO skb counts as one packet. */
struct flow_val {
	u64 first_ns; /* CLOCK_MONOTONIC_COARSE (jiffy resolution) */
	u64 last_ns;
	u64 bytes[2];
	u64 pkts[2];
	u32 flags;
	u32 tgid;
	u32 ns_tgid;
	u32 pad;
	char comm[16];
};

/* The process a socket belongs to: the one that created, connected or last
 * sent on it (accepted sockets inherit their listener's). */
struct sock_owner {
	u32 tgid;
	u32 ns_tgid;
	char comm[16];
};

/* Per watched cgroup: what could not be recorded. */
struct net_watch {
	u64 lost_pkts; /* packets not accounted: the flow table was full */
	u64 lost_dns;  /* DNS messages not copied: the ring was full */
};

/* The first bytes of one port-53 payload (UDP, or one TCP segment). */
struct dns_ev {
	struct flow_key key;
	u64 ts; /* CLOCK_MONOTONIC */
	u32 tgid;
	u32 ns_tgid;
	char comm[16];
	u8 dir;
	u8 has_owner;
	u16 len;      /* bytes in data */
	u32 orig_len; /* bytes of payload */
	u8 data[DNS_MAX];
};

#endif
