package jail

import (
	"errors"
	"strings"
	"testing"

	"github.com/agentjail/agentjail/internal/config"
	"github.com/agentjail/agentjail/internal/errdefs"
	"github.com/agentjail/agentjail/internal/model"
)

func TestDerivedNameFits(t *testing.T) {
	for _, base := range []string{"s", "web", strings.Repeat("a", 56), strings.Repeat("b", 57), strings.Repeat("c", 63)} {
		n := derivedName(base, "0123456789ab")
		if err := config.ValidName(n); err != nil {
			t.Errorf("derivedName(%d chars): %v", len(base), err)
		}
		if !strings.HasSuffix(n, "-012345") {
			t.Errorf("derivedName(%q) = %q: no id suffix", base, n)
		}
	}
}

func TestBranchNames(t *testing.T) {
	m := &Manager{names: map[nameKey]string{{"default", "taken"}: "0123456789ab"}}
	cases := []struct {
		req  model.BranchRequest
		want []string
		err  error
	}{
		{req: model.BranchRequest{}, want: []string{""}},
		{req: model.BranchRequest{Count: 3}, want: []string{"", "", ""}},
		{req: model.BranchRequest{Count: 2, NamePrefix: "web"}, want: []string{"web-1", "web-2"}},
		{req: model.BranchRequest{Names: []string{"a", "b"}}, want: []string{"a", "b"}},
		{req: model.BranchRequest{Count: 2, Names: []string{"a", "b"}}, want: []string{"a", "b"}},
		{req: model.BranchRequest{Count: 3, Names: []string{"a", "b"}}, err: errdefs.ErrInvalid},
		{req: model.BranchRequest{Names: []string{"a"}, NamePrefix: "p"}, err: errdefs.ErrInvalid},
		{req: model.BranchRequest{Names: []string{"a", "a"}}, err: errdefs.ErrInvalid},
		{req: model.BranchRequest{Names: []string{"a", "-bad"}}, err: errdefs.ErrUnprocessable},
		{req: model.BranchRequest{Names: []string{"a", "taken"}}, err: errdefs.ErrConflict},
		{req: model.BranchRequest{Count: 1, NamePrefix: "taken-"}, want: []string{"taken--1"}},
		{req: model.BranchRequest{Count: 33}, err: errdefs.ErrInvalid},
		{req: model.BranchRequest{Count: -1}, err: errdefs.ErrInvalid},
		{req: model.BranchRequest{NamePrefix: strings.Repeat("x", 62)}, err: errdefs.ErrUnprocessable},
	}
	for _, c := range cases {
		got, err := m.branchNames("", c.req)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("branchNames(%+v): err %v, want %v", c.req, err, c.err)
			}
			continue
		}
		if err != nil || strings.Join(got, ",") != strings.Join(c.want, ",") || len(got) != len(c.want) {
			t.Errorf("branchNames(%+v) = %q, %v; want %q", c.req, got, err, c.want)
		}
	}
}
