package observe

import (
	"context"
	"errors"
	"testing"
	"time"
)

func publishN(b *Bus, n int, typ Type) {
	for i := 0; i < n; i++ {
		ev := Event{Type: typ, PID: int32(i)}
		b.Publish(&ev)
	}
}

func TestBusLateJoinerAndFilter(t *testing.T) {
	b := NewBus(16)
	publishN(b, 5, TypeSyscall)
	ev := Event{Type: TypeProc, Op: "exec"}
	if seq := b.Publish(&ev); seq != 6 || ev.Seq != 6 {
		t.Fatalf("seq %d / %d, want 6", seq, ev.Seq)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	got, err := b.Subscribe(2, 0).Next(ctx, make([]Event, 0, 100))
	if err != nil || len(got) != 4 || got[0].Seq != 3 || got[3].Seq != 6 {
		t.Fatalf("since 2: %d events, first %+v, err %v", len(got), got, err)
	}
	got, err = b.Subscribe(0, MaskOf(TypeProc)).Next(ctx, nil)
	if err != nil || len(got) != 1 || got[0].Op != "exec" {
		t.Fatalf("proc filter: %+v, %v", got, err)
	}
}

func TestBusSlowSubscriberSkipsAhead(t *testing.T) {
	b := NewBus(16)
	sub := b.Subscribe(0, 0)
	publishN(b, 40, TypeSyscall) // laps the subscriber
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := sub.Next(ctx, nil)
	if err != nil || len(got) != 1 || got[0].Type != TypeNotice || got[0].Lost != 24 {
		t.Fatalf("want one notice of 24 skipped, got %+v, %v", got, err)
	}
	got, err = sub.Next(ctx, make([]Event, 0, 64))
	if err != nil || len(got) != 16 || got[0].Seq != 25 || got[15].Seq != 40 {
		t.Fatalf("after skip: %d events, err %v", len(got), err)
	}
}

func TestBusWakesWaitersAndCloses(t *testing.T) {
	b := NewBus(16)
	sub := b.Subscribe(b.Last(), 0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	result := make(chan []Event)
	go func() {
		got, _ := sub.Next(ctx, nil)
		result <- got
	}()
	ev := Event{Type: TypeFile, Op: "open"}
	b.Publish(&ev)
	if got := <-result; len(got) != 1 || got[0].Op != "open" {
		t.Fatalf("woken with %+v", got)
	}
	b.Close()
	b.Close()
	if _, err := sub.Next(ctx, nil); !errors.Is(err, ErrBusClosed) {
		t.Fatalf("after close: %v", err)
	}
	short, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := NewBus(1).Subscribe(0, 0).Next(short, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
