package callback

// AppendBody exposes appendBody to the package's tests.
var AppendBody = appendBody
