package api

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkFieldNames scans the bytes itself; these bodies are where a scanner
// could lose its place: escapes, strings holding braces and quotes, nested
// values, whitespace everywhere.
func TestCheckFieldNames(t *testing.T) {
	t.Parallel()
	create := reflect.TypeFor[createRequest]()
	for _, tc := range []struct {
		name, body, err string
	}{
		{"empty object", `{}`, ""},
		{"known names", `{"namespace":"a","id":"b","executeAt":"x","callbackUrl":"u"}`, ""},
		{"whitespace", " \n{ \"namespace\" :\t\"a\" ,\r\n \"id\" : \"b\" } \n", ""},
		{"nested values skipped", `{"payload":{"namespace":1,"x":[{"}":"{"},"]"],"q":"\"}"},"id":"b"}`, ""},
		{"literals and numbers", `{"payload":[true,false,null,-1.5e3],"callbackTimeoutSeconds":5,"id":"b"}`, ""},
		{"escaped known name", `{"\u006eamespace":"a"}`, ""},
		{"escaped unknown name", `{"na\u006de":"a"}`, `unknown field "name"`},
		{"unknown after nested", `{"payload":{"a":"}"},"bogus":1}`, `unknown field "bogus"`},
		{"duplicate", `{"id":"a","payload":null,"id":"b"}`, `duplicate field "id"`},
		{"duplicate by escape", `{"id":"a","\u0069d":"b"}`, `duplicate field "id"`},
		{"string with escaped quote then unknown", `{"id":"a\"b","x":1}`, `unknown field "x"`},
		{"case differs", `{"ID":"a"}`, `unknown field "ID"`},
		{"invalid JSON is the decoder's", `{"bogus":1`, ""},
		{"not an object is the decoder's", `["bogus"]`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkFieldNames([]byte(tc.body), create, "")
			if tc.err == "" {
				require.NoError(t, err)
			} else {
				require.EqualError(t, err, tc.err)
			}
		})
	}
}

// The fast path for plain strings gives what encoding/json gives.
func TestOptionalStringFastPath(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{`"plain"`, `""`, `"üñï"`, `"a\"b"`, `"a\\b"`, `"\u0041"`, "\"bad \xff\"", `"tab	in"`} {
		var fast optional[string]
		err := fast.UnmarshalJSON([]byte(raw))
		var want string
		wantErr := json.Unmarshal([]byte(raw), &want)
		if wantErr != nil {
			require.Error(t, err, raw)
			continue
		}
		require.NoError(t, err, raw)
		require.Equal(t, want, fast.value, raw)
	}
}
