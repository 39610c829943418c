{{- define "agentjail.name" -}}{{ .Release.Name }}{{- end -}}
{{- define "agentjail.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}
{{- define "agentjail.tokenSecret" -}}{{ .Values.token.existingSecret | default (printf "%s-token" .Release.Name) }}{{- end -}}
{{- define "agentjail.labels" -}}
app.kubernetes.io/name: agentjail
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}
