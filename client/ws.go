package client

import (
	"context"
	"fmt"
	"net/http"

	"github.com/coder/websocket"
)

// wsReadLimit bounds one WebSocket message from the daemon.
const wsReadLimit = 16 << 20

// dialWS opens the WebSocket of the API path (with its query) with the
// client's token and HTTP client. A refusal by the daemon is its
// *APIError; what names the route in other errors.
func (c *Client) dialWS(ctx context.Context, path, what string) (*websocket.Conn, error) {
	hdr := http.Header{}
	if c.Token != "" {
		hdr.Set("Authorization", "Bearer "+c.Token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	conn, resp, err := websocket.Dial(ctx, c.BaseURL+path, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: hdr, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			if resp.Body != nil {
				defer resp.Body.Close()
			}
			return nil, readAPIError(resp)
		}
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	conn.SetReadLimit(wsReadLimit)
	return conn, nil
}
