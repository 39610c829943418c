package lazyre

import "testing"

func TestNewCompilesOnce(t *testing.T) {
	re := New(`^a+$`)
	if !re().MatchString("aaa") || re().MatchString("ab") {
		t.Fatal("the expression does not match as written")
	}
	if first, again := re(), re(); first != again {
		t.Fatal("each call compiled the expression again")
	}
}

func TestNewInvalidPanicsOnUse(t *testing.T) {
	re := New(`(`)
	defer func() {
		if recover() == nil {
			t.Fatal("an invalid expression compiled")
		}
	}()
	re()
}
