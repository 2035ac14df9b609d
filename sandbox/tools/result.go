package tools

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cellbox/cellbox/internal/fastjson"
	"github.com/cellbox/cellbox/sandbox/api"
)

// AppendResult appends the result object of a call to dst:
// {"is_error":..., ["error", "code"], ["notice"], output fields...}, where
// out is the handler's output (a struct whose fields follow the head), err
// its error and code err's API code (api.Code*), notices what happened on
// the way. It is written into one buffer: the output is most often one long
// content, which fastjson quotes straight into it. An output that does not
// encode as an object is an internal error.
func AppendResult(dst []byte, out any, err error, code string, notices []string) json.RawMessage {
	start := len(dst)
	buf := dst
	head := func(isError bool) {
		buf = append(buf[:start], `{"is_error":`...)
		buf = strconv.AppendBool(buf, isError)
		if isError {
			buf = append(buf, `,"error":`...)
			buf = fastjson.AppendString(buf, err.Error(), false)
			buf = append(buf, `,"code":`...)
			buf = fastjson.AppendString(buf, code, false)
		}
		if len(notices) > 0 {
			buf = append(buf, `,"notice":`...)
			buf = fastjson.AppendString(buf, strings.Join(notices, "; "), false)
		}
	}
	if err == nil {
		head(false)
		n := len(buf)
		var merr error
		buf, merr = fastjson.AppendMarshal(buf, out, false)
		switch body := buf[n:]; {
		case merr != nil:
			err, code = fmt.Errorf("encode result: %w", merr), api.CodeInternal
		case len(body) < 2 || body[0] != '{':
			err, code = errors.New("tool result is not an object"), api.CodeInternal
		case len(body) == 2: // {}: no output fields
			return append(buf[:n], '}')
		default: // the output's fields follow the head's
			body[0] = ','
			return buf
		}
	}
	head(true)
	return append(buf, '}')
}
