package capability

import "testing"

func TestParseEffective(t *testing.T) {
	tests := []struct {
		name    string
		status  string
		want    uint64
		netAdm  bool
		wantErr bool
	}{
		{name: "root", status: "Name:\tnetop\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t000001ffffffffff\n", want: 0x1ffffffffff, netAdm: true},
		{name: "unprivileged", status: "Name:\tnetop\nCapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\n", want: 0},
		{name: "only NET_ADMIN", status: "CapEff:\t0000000000001000", want: 1 << 12, netAdm: true},
		{name: "NET_RAW but not NET_ADMIN", status: "CapEff:\t0000000000002000\n", want: 1 << 13},
		{name: "missing", status: "Name:\tnetop\nCapPrm:\t000001ffffffffff\n", wantErr: true},
		{name: "garbage", status: "CapEff:\tzzzz\n", wantErr: true},
		{name: "empty", status: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseEffective(tc.status)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("caps = %#x, want %#x", got, tc.want)
			}
			if has := got&(1<<NetAdmin) != 0; has != tc.netAdm {
				t.Errorf("CAP_NET_ADMIN = %v, want %v", has, tc.netAdm)
			}
		})
	}
}
